"""DDP: the tiny decoder of ddp_worker.py trained 3 steps with
DistributedDataParallel (gloo, 2 processes on loopback, 2 sequences each)
ends with the same parameters as 1 process on the concatenated batch of 4.

DDP averages the ranks' gradients; with a mean loss over equal shares that
is the whole batch's gradient up to the order of summation, so the
parameters agree to float64 rounding (observed ~1e-16; bound 1e-12). The
test starts its own processes and kills them after 120 s."""
import os
import socket
import subprocess
import sys

import pytest
import torch

import ddp_worker

WORKER = os.path.join(os.path.dirname(__file__), "ddp_worker.py")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


@pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                    reason="torch.distributed with gloo not available")
def test_ddp_two_processes_equal_one(tmp_path):
    out = str(tmp_path / "ddp.pt")
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, WORKER, str(r), "2", port, out], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=120)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log

    single = ddp_worker.train(ddp_worker.fresh_model(), ddp_worker.data()).state_dict()
    initial = ddp_worker.fresh_model().state_dict()
    ddp = torch.load(out)
    assert ddp.keys() == single.keys()
    for name in single:
        diff = (ddp[name] - single[name]).abs().max().item()
        moved = (single[name] - initial[name]).abs().max().item()
        assert moved > 1e-3, name  # training changed every parameter tensor
        print(f"[ddp] {name}: max |2 processes - 1 process| = {diff:.2e} (moved {moved:.2e})")
        assert diff <= 1e-12, (name, diff)
