/* molt-run: the driver that `molt run` execs (work in progress). */
int main(void) { return 1; }
