# Full updates end to end (docs/full-updates.md): test programs in
# tests/fullupdate/progs built with this tree's moltcc --molt-program,
# started with `molt run`, replaced with `molt update`.  One ctest test per
# pytest file, each with its own work directory so they can run in
# parallel; plus the kvfull demo (examples/kvfull) in its short form.
foreach(area values heap control failures abort real blocking untyped memory)
  molt_pytest(fullupdate_${area} ${CMAKE_CURRENT_LIST_DIR}/test_${area}.py
    TIMEOUT 300 LABELS fullupdate moltcc cli
    ENV FU_WORK=${CMAKE_CURRENT_BINARY_DIR}/fullupdate/${area})
endforeach()

# The demo, with its images in this build tree (not examples/kvfull/obj,
# which another build tree may be using).
add_test(NAME fullupdate_kvfull_demo
  COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/examples/kvfull/demo.py --short
          --molt-build ${CMAKE_BINARY_DIR} --obj ${CMAKE_CURRENT_BINARY_DIR}/fullupdate/kvfull)
set_tests_properties(fullupdate_kvfull_demo PROPERTIES TIMEOUT 300
  LABELS "fullupdate;demo;moltcc;cli")

# A real server, short version (examples/fullreal/run.sh --updates 3):
# memcached from Debian's source package (apt-get source: network, the
# Debian archive) made a program image with make CC="moltcc --molt-program"
# and examples/fullreal/memcached.patch, running with its defaults (helper
# threads included), updated 3 times under mcload's checking load.  Fails on
# a failed update or reply, a lost connection, or descriptors or threads
# that are not what they were.  Plain build tree only, and labelled
# realworld instead of fullupdate: the server is not built with a sanitizer
# (ThreadSanitizer and AddressSanitizer runtimes would have to be preloaded
# into an uninstrumented server), and its ~1.5 minutes (configure, 4 image
# links with --molt-from) are spent once.  The work directory, outside the
# repository, keeps the fetched package for the next run.
#   by hand:  ctest --test-dir build -R fullupdate_memcached --output-on-failure
if(NOT MOLT_SANITIZE)
  string(SHA1 molt_fullreal_key "${CMAKE_BINARY_DIR}")
  string(SUBSTRING "${molt_fullreal_key}" 0 8 molt_fullreal_tag)
  string(SUBSTRING "${molt_fullreal_key}" 0 2 molt_fullreal_byte)
  math(EXPR molt_fullreal_port "27460 + 100 * (0x${molt_fullreal_byte} % 50)")
  add_test(NAME fullupdate_memcached
    COMMAND bash ${PROJECT_SOURCE_DIR}/examples/fullreal/run.sh --updates 3 --failures)
  set_tests_properties(fullupdate_memcached PROPERTIES TIMEOUT 900 LABELS "realworld;demo"
    ENVIRONMENT "MOLT_BUILD=${CMAKE_BINARY_DIR};MOLT_FULLREAL_WORK=/var/tmp/molt-fullreal-ctest-${molt_fullreal_tag};MOLT_FULLREAL_PORT=${molt_fullreal_port}")
endif()

# The second real server, short version (examples/fullreal/tinyproxy/run.sh
# --updates 3 --failures): tinyproxy from Debian's source package (apt-get source)
# made a program image with make CC="moltcc --molt-program" and
# examples/fullreal/tinyproxy/tinyproxy.patch (30 changed lines), a forward
# proxy with a thread per connection, updated 3 times under httpload's
# checking load (a new connection per request, status and body checked)
# through the proxy to examples/fixes/common/origin.py, then an update
# while a CONNECT tunnel is open (its thread relays and has an update point
# there: the update must succeed and the tunnel carry a checked request
# before and after it), then an update while a client holds a connection
# open and sends nothing (its thread has no update point while it reads the
# request: the update must time out naming it by its entry function, the
# old version serving on) and the same update after the client closed.
# Fails on a failed update or reply, a wrong outcome of those three, or
# descriptors or threads that are not what they were once the load stopped.
# Plain build tree only, labelled realworld, for the reasons of
# fullupdate_memcached above; about a minute (configure, 5 image links).  Ports: the proxy at base+92 and the origin at base+91 of the same
# per-tree base as fullupdate_memcached's (+60) and realworld_fixes' (+80..+89).
#   by hand:  ctest --test-dir build -R fullupdate_tinyproxy --output-on-failure
if(NOT MOLT_SANITIZE)
  math(EXPR molt_fullreal_tp_port "27492 + 100 * (0x${molt_fullreal_byte} % 50)")
  add_test(NAME fullupdate_tinyproxy
    COMMAND bash ${PROJECT_SOURCE_DIR}/examples/fullreal/tinyproxy/run.sh --updates 3 --failures)
  set_tests_properties(fullupdate_tinyproxy PROPERTIES TIMEOUT 600 LABELS "realworld;demo"
    ENVIRONMENT "MOLT_BUILD=${CMAKE_BINARY_DIR};MOLT_FULLREAL_WORK=/var/tmp/molt-fullreal-tinyproxy-ctest-${molt_fullreal_tag};MOLT_FULLREAL_PORT=${molt_fullreal_tp_port}")
endif()

# A real version pair that changes a type, short version
# (examples/fullreal/mosquitto/run.sh --rounds 1 --abort): the MQTT broker mosquitto
# from Debian's source package, its security update 2.0.11-1.2+deb12u1
# updated under mqttload's checking load to +deb12u2, whose CVE-2024-8376
# fix splits struct mosquitto_db's `subs` into `normal_subs` and a new
# `shared_subs` (examples/fullreal/mosquitto/deb12u2.xf moves the shared
# subscriptions), after an update that must abort (the same .xf with a
# fault after its stores: the old version must serve on with its tree as it
# was).  Fails on a failed update, a lost, repeated or wrong
# message, a lost connection or retained message, a shared subscription
# made before the update that is not delivered once or survives its
# UNSUBSCRIBE, the new field not seen by gdb in the running broker, or
# descriptors that are not what they were.  Plain build tree only,
# labelled realworld, for the reasons of fullupdate_memcached above.  The
# broker's port: base+94 of the same per-tree base.
#   by hand:  ctest --test-dir build -R fullupdate_mosquitto --output-on-failure
if(NOT MOLT_SANITIZE)
  math(EXPR molt_fullreal_mq_port "27494 + 100 * (0x${molt_fullreal_byte} % 50)")
  add_test(NAME fullupdate_mosquitto
    COMMAND bash ${PROJECT_SOURCE_DIR}/examples/fullreal/mosquitto/run.sh --rounds 1 --abort)
  set_tests_properties(fullupdate_mosquitto PROPERTIES TIMEOUT 600 LABELS "realworld;demo"
    RESOURCE_LOCK molt_fullreal_mosquitto
    ENVIRONMENT "MOLT_BUILD=${CMAKE_BINARY_DIR};MOLT_FULLREAL_WORK=/var/tmp/molt-fullreal-mosquitto-ctest-${molt_fullreal_tag};MOLT_FULLREAL_PORT=${molt_fullreal_mq_port}")

  # The same broker under shadowed updates, short version
  # (examples/fullreal/mosquitto/shadow.sh --seconds 8): deb12u1 shadowed
  # by itself under mqttload's checking load and fresh clients (0
  # divergences, the follower caught up), a version that acks one topic
  # with another packet id (a divergence with both sides) and crashes on
  # another (the follower ended by its signal), a transformer that faults
  # in the follower (fullupdate_mosquitto's u2fault.so), then deb12u1 -> deb12u2
  # with deb12u2.xf: promote, rollback, and promote, commit; then a broker
  # with persistence autosave (the shadow ends at the follower's first save,
  # the file named).  Fails on a
  # false divergence, a difference not caught, a lost, repeated or wrong
  # message, a lost connection or retained message, or descriptors that
  # are not what they were.  Shares fullupdate_mosquitto's work directory
  # (after it: its images and deb12u1's tree; the two variants are linked
  # here, then kept) and port.  About 35-45 s on top of the variants' links.
  #   by hand:  ctest --test-dir build -R shadowupd_mosquitto --output-on-failure
  add_test(NAME shadowupd_mosquitto
    COMMAND bash ${PROJECT_SOURCE_DIR}/examples/fullreal/mosquitto/shadow.sh --seconds 8)
  set_tests_properties(shadowupd_mosquitto PROPERTIES TIMEOUT 600 LABELS "realworld;demo"
    DEPENDS fullupdate_mosquitto RESOURCE_LOCK molt_fullreal_mosquitto
    ENVIRONMENT "MOLT_BUILD=${CMAKE_BINARY_DIR};MOLT_FULLREAL_WORK=/var/tmp/molt-fullreal-mosquitto-ctest-${molt_fullreal_tag};MOLT_FULLREAL_PORT=${molt_fullreal_mq_port}")
endif()
