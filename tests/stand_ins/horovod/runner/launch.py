"""Stand-in for `horovodrun` (`python -m horovod.runner.launch -np N -H localhost:N COMMAND...`)."""

import os
import signal
import socket
import subprocess
import sys


def main(argv: list[str]) -> int:
    n = int(argv[argv.index("-np") + 1])
    command = argv[argv.index("-H") + 2:]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(n):
        env = dict(os.environ, HOROVOD_RANK=str(rank), HOROVOD_SIZE=str(n), HOROVOD_LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen(command, env=env))

    def forward(signum, frame):
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    codes = [p.wait() for p in procs]
    return next((c for c in codes if c), 0)


if __name__ == "__main__":
    with open(os.environ.get("HOROVOD_STANDIN_LOG", os.devnull), "a") as f:
        f.write(f"launcher {' '.join(sys.argv[1:5])}\n")
    sys.exit(main(sys.argv[1:]))
