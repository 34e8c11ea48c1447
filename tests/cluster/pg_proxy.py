# SPDX-License-Identifier: MIT
"""A Unix-socket proxy in front of a PostgreSQL server that can lose one
reply: the first time a client's message contains `pattern`, the proxy
forwards it, waits until the server has answered it (ReadyForQuery, so the
statement has committed), swallows the answer and closes both connections.
The client sees a broken connection after a commit: an outcome it cannot
know.  Later connections pass through untouched.

    with ReplyDropper(pg.dir, 5432, b"kairos_wal_append") as px:
        px.conninfo("db")   # host=<proxy dir> port=5432 ...
        px.dropped          # how many replies were swallowed
"""
import os
import select
import socket
import tempfile
import threading


class ReplyDropper:
    def __init__(self, server_dir, port, pattern, user="kairos"):
        self.target = os.path.join(server_dir, f".s.PGSQL.{port}")
        self.port = port
        self.pattern = pattern
        self.user = user
        self.dropped = 0
        self.armed = True
        self.lock = threading.Lock()
        self.dir = tempfile.mkdtemp(prefix="kpx", dir="/tmp")
        self.path = os.path.join(self.dir, f".s.PGSQL.{port}")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen(16)
        self.stopping = False
        self.thread = threading.Thread(target=self._accept, daemon=True)

    def conninfo(self, db):
        return f"host={self.dir} port={self.port} user={self.user} dbname={db}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stopping = True
        try:
            # wake accept()
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(self.path)
            s.close()
        except OSError:
            pass
        self.thread.join(10)
        self.sock.close()
        try:
            os.unlink(self.path)
            os.rmdir(self.dir)
        except OSError:
            pass

    def _accept(self):
        while not self.stopping:
            c, _ = self.sock.accept()
            if self.stopping:
                c.close()
                break
            threading.Thread(target=self._pipe, args=(c,), daemon=True).start()

    def _pipe(self, client):
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            server.connect(self.target)
            dropping = False
            seen = b""
            while True:
                r, _, _ = select.select([client, server], [], [], 60)
                if not r:
                    break
                if client in r:
                    data = client.recv(65536)
                    if not data:
                        break
                    with self.lock:
                        if self.armed and self.pattern in data:
                            self.armed = False
                            dropping = True
                    server.sendall(data)
                if server in r:
                    data = server.recv(65536)
                    if not data:
                        break
                    if dropping:
                        # ReadyForQuery ('Z', length 5, status): the statement
                        # is over and committed; the client never hears it.
                        seen += data
                        if b"Z\x00\x00\x00\x05" in seen:
                            with self.lock:
                                self.dropped += 1
                            break
                        continue
                    client.sendall(data)
        except OSError:
            pass
        finally:
            client.close()
            server.close()
