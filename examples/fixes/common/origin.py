#!/usr/bin/env python3
"""A small HTTP origin server for examples/fixes (stdlib only): serves the
files of DIR (made by `httpload.py --write-files DIR`) on 127.0.0.1:PORT,
one thread per connection, HTTP/1.1 with Content-Length.

    origin.py --port PORT --dir DIR"""
import argparse, http.server, os, socketserver


class Handler(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--dir", required=True)
    a = p.parse_args()
    os.chdir(a.dir)
    Server(("127.0.0.1", a.port), Handler).serve_forever()
