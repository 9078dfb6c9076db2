/* An ordinary shared library: not a molt patch. */
int plain_function(int x) { return x + 1; }
