/* Full-update fixture, version 2: unchanged. */
static int counter;

void stats_tick(void) {
  static int calls; /* function-scope static: not migrated */
  calls++;
  counter++;
}

int stats_counter(void) { return counter; }
