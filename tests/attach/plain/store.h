/* The store of the plain test server: named records looked up by index. */
#ifndef STORE_H
#define STORE_H

#define NRECORDS 8

struct record {
  int id;
  char name[16];
};

const char *lookup(long i);
const char *lookup_first(void);
long next_id(void);
long store_served(void);
void store_init(void);

#endif
