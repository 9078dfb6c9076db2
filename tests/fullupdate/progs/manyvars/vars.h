/* The 96 int globals g0..g95 of the manyvars test, shared by both
 * versions.  96 globals cover every 4-byte-aligned low address byte, so
 * whatever the layout, some sit at addresses whose bytes look like DWARF
 * opcodes (e.g. ...e0) -- moltcc once took such globals for thread-locals
 * and did not migrate them.  The macros expand to ordinary, separate
 * definitions: the DWARF sees 96 variables. */
/* clang-format off */
#define MANYVARS(X)                                                            \
  X(0)  X(1)  X(2)  X(3)  X(4)  X(5)  X(6)  X(7)  X(8)  X(9)  X(10) X(11)      \
  X(12) X(13) X(14) X(15) X(16) X(17) X(18) X(19) X(20) X(21) X(22) X(23)      \
  X(24) X(25) X(26) X(27) X(28) X(29) X(30) X(31) X(32) X(33) X(34) X(35)      \
  X(36) X(37) X(38) X(39) X(40) X(41) X(42) X(43) X(44) X(45) X(46) X(47)      \
  X(48) X(49) X(50) X(51) X(52) X(53) X(54) X(55) X(56) X(57) X(58) X(59)      \
  X(60) X(61) X(62) X(63) X(64) X(65) X(66) X(67) X(68) X(69) X(70) X(71)      \
  X(72) X(73) X(74) X(75) X(76) X(77) X(78) X(79) X(80) X(81) X(82) X(83)      \
  X(84) X(85) X(86) X(87) X(88) X(89) X(90) X(91) X(92) X(93) X(94) X(95)
/* clang-format on */

#define MV_DEFINE(i) int g##i = i;
#define MV_SET(i) g##i = 1000 + i;
/* The first global whose value is not 1000 + its index, and the sum. */
#define MV_CHECK(i)                                                                      \
  sum += g##i;                                                                           \
  if (wrong < 0 && g##i != 1000 + i)                                                     \
    wrong = i;

MANYVARS(MV_DEFINE)
