"""Real servers for the object-storage and tracker tests, all on 127.0.0.1 at free ports and torn down by their
fixtures: moto's S3 server (ThreadedMotoServer, with IAM authentication switched on so that wrong credentials are
refused as AWS refuses them), a small HTTP proxy in front of it that injects real faults (HTTP 500 answers, a
server that goes away mid-request), and `mlflow server` with a SQLite backend.

moto keeps its buckets in this process's memory, so stopping its server and starting a new one on the same port is
a restart that keeps the data, as a real store's restart does (a new MotoS3 resets them: one at a time)."""
import http.client
import http.server
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

REGION = "us-east-1"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoS3:
    """moto's S3 server. `auth()` creates an IAM user whose keys the server then demands (SigV4-checked)."""

    def __init__(self):
        import logging

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
        self.port = free_port()
        self.server = None
        self.start()
        # moto's buckets and users live in this process, shared by every server it starts: begin empty
        urllib.request.urlopen(urllib.request.Request(f"{self.url}/moto-api/reset", method="POST"), timeout=10)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def start(self):
        from moto.server import ThreadedMotoServer

        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()

    def stop(self):
        if self.server is not None:
            self.server.stop()
            self.server = None

    def client(self, key, secret):
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.url, aws_access_key_id=key, aws_secret_access_key=secret,
                            region_name=REGION, config=Config(s3={"addressing_style": "path"}))

    def auth(self, actions="*", user="trainer"):
        """(access key id, secret) of a new user allowed `actions` (all by default). `enforce(True)` then makes the server demand them
        (moto's INITIAL_NO_AUTH_ACTION_COUNT): every request must be SigV4-signed with an existing key. (moto
        5.2 then also refuses, as SignatureDoesNotMatch, a signed list whose Prefix or Delimiter holds a '/', which
        AWS accepts: the tests that list folders run with enforcement off.)"""
        import boto3

        iam = boto3.client("iam", endpoint_url=self.url, aws_access_key_id="setup", aws_secret_access_key="setup",
                           region_name=REGION)
        iam.create_user(UserName=user)
        iam.put_user_policy(UserName=user, PolicyName="policy", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}]}))
        key = iam.create_access_key(UserName=user)["AccessKey"]
        return key["AccessKeyId"], key["SecretAccessKey"]

    @staticmethod
    def enforce(on):
        import moto.settings
        from moto.core.authorization import ActionAuthenticatorMixin

        moto.settings.INITIAL_NO_AUTH_ACTION_COUNT = 0 if on else float("inf")
        ActionAuthenticatorMixin.request_count = 0

    def close(self):
        self.enforce(False)
        self.stop()


class FaultProxy:
    """An HTTP proxy to `upstream` that obeys rules: each rule is (method, path regex, action, times) with action
    "500" (answer HTTP 500 InternalError), or a callable run before forwarding (e.g. stopping the server). `times`
    is how often the rule fires (None: always). When the upstream is down the client's connection is dropped
    without an answer, as a vanished server drops it. `seen` logs (method, path) of every request."""

    def __init__(self, upstream_port):
        self.upstream_port = upstream_port
        self.rules, self.seen, self.lock = [], [], threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def handle_one(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                action = proxy.match(self.command, self.path)
                if action == "500":
                    data = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InternalError</Code><Message>'
                            b'We encountered an internal error. Please try again.</Message></Error>')
                    self.send_response(500)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                if callable(action):
                    action()
                try:
                    conn = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=60)
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "expect")}
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    conn.close()
                except OSError:  # the server is down: the client sees its connection dropped
                    self.close_connection = True
                    return
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                # a HEAD answer carries the object's length, not its own (empty) body's
                self.send_header("Content-Length", resp.getheader("Content-Length", "0") if self.command == "HEAD"
                                 else str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = handle_one

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def add(self, method, pattern, action, times=None):
        with self.lock:
            self.rules.append([method, re.compile(pattern), action, times])

    def clear(self):
        with self.lock:
            self.rules.clear()
            self.seen.clear()

    def match(self, method, path):
        with self.lock:
            self.seen.append((method, path))
            for rule in self.rules:
                m, pattern, action, times = rule
                if (m is None or m == method) and pattern.search(path) and (times is None or times > 0):
                    if times is not None:
                        rule[3] -= 1
                    return action
        return None

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def outage(moto, seconds, log=None):
    """An action for FaultProxy: stop the S3 server now and start it again `seconds` later (in a thread); `log`
    gets what the bucket holds during the outage, via `log(moto)` just before the stop: the request that triggered
    it has not been forwarded, and nothing reaches a stopped server. (Read after the restart, a client's retry could
    land first on a busy machine.)"""
    def act():
        if log is not None:
            log(moto)
        moto.stop()

        def back():
            time.sleep(seconds)
            moto.start()

        threading.Thread(target=back, daemon=True).start()

    return act


class MlflowServer:
    """`mlflow server` with a SQLite backend and proxied artifacts, in its own process group."""

    def __init__(self, root):
        self.port = free_port()
        self.root = root
        cmd = [os.path.join(os.path.dirname(sys.executable), "mlflow"), "server", "--host", "127.0.0.1",
               "--port", str(self.port), "--workers", "1", "--backend-store-uri", f"sqlite:///{root}/mlflow.db",
               "--artifacts-destination", f"{root}/artifacts"]
        if not os.path.exists(cmd[0]):
            cmd[0] = shutil.which("mlflow") or cmd[0]
        self.log = open(os.path.join(root, "server.log"), "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
                                     env=dict(os.environ, MLFLOW_TRACKING_URI=""))
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.5)
        self.close()
        raise RuntimeError(f"mlflow server did not start: {open(os.path.join(root, 'server.log')).read()[-2000:]}")

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def close(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def isolated_aws_env(tmp, key, secret):
    """The environment a training process gets: these credentials and nothing from ~/.aws."""
    return {"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret, "AWS_DEFAULT_REGION": REGION,
            "AWS_CONFIG_FILE": os.path.join(tmp, "no-aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": os.path.join(tmp, "no-aws-credentials")}
