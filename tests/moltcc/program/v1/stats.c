/* Full-update fixture, version 1: statics of another file. */
static int counter;

void stats_tick(void) {
  static int calls; /* function-scope static: not migrated */
  calls++;
  counter++;
}

int stats_counter(void) { return counter; }
