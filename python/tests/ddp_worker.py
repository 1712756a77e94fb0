"""A tiny byte-level decoder using continuum attention, trained a few SGD
steps; run by test_ddp.py either in-process (1 process, whole batch) or as
`python ddp_worker.py RANK WORLD PORT OUT` (torch.distributed, gloo on
loopback, each rank its contiguous share of the batch)."""
import datetime
import importlib
import os
import sys
import time

import torch

import continuum_attention as ca

VOCAB, DIM, HEADS, LEN, BATCH, STEPS = 32, 16, 2, 12, 4, 3


class Decoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, DIM, dtype=torch.float64)
        self.qkv = torch.nn.Linear(DIM, 3 * DIM, dtype=torch.float64)
        self.out = torch.nn.Linear(DIM, VOCAB, dtype=torch.float64)
        self.tau = torch.nn.Parameter(torch.full((HEADS,), 0.5, dtype=torch.float64))

    def forward(self, tokens):
        B, L = tokens.shape
        x = self.emb(tokens)
        q, k, v = self.qkv(x).view(B, L, 3, HEADS, DIM // HEADS).unbind(2)
        o = ca.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True,
                         temperature=self.tau)
        return self.out(x + o.transpose(1, 2).reshape(B, L, DIM))


def data():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (STEPS, BATCH, LEN + 1), generator=g)


def train(model, batches, rank=0, world=1):
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    share = BATCH // world
    for tokens in batches:
        tokens = tokens[rank * share:(rank + 1) * share]
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


def fresh_model():
    torch.manual_seed(0)
    return Decoder()


def main():
    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    torch.set_num_threads(1)
    # Import torch.distributed.nn before the group exists. Its functions take
    # `group=group.WORLD` as a default, evaluated at import; DDP's constructor
    # imports it (through torch._dynamo), and after init_process_group that
    # pins the default gloo group for the life of the process:
    # destroy_process_group() then frees nothing, and the group's worker
    # threads outlive Python's finalization. A worker thread that frees a
    # tensor then needs the GIL, and CPython ends such a thread with
    # pthread_exit, which C++ turns into std::terminate: SIGABRT, "terminate
    # called without an active exception", after the work was done.
    importlib.import_module("torch.distributed.nn")
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world,
                                         timeout=datetime.timedelta(seconds=60))
    model = torch.nn.parallel.DistributedDataParallel(fresh_model())
    train(model, data(), rank, world)
    if rank == 0:
        torch.save(model.module.state_dict(), out)
    # Shut down in order: no rank leaves while another still talks to it, and
    # DDP's reducer lets go of the process group, so that destroying it joins
    # its threads now, while the interpreter is fully alive.
    torch.distributed.barrier()
    del model
    torch.distributed.destroy_process_group()
    # The group's threads are joined by now; their /proc entries may linger a
    # moment. Still there after seconds, the group is still referenced
    # somewhere: fail here every time rather than at exit now and then.
    deadline = time.monotonic() + 10
    while gloo_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    if gloo_threads():
        sys.exit(f"rank {rank}: destroy_process_group() left threads running: {gloo_threads()}")


def gloo_threads():
    """Names of this process's c10d/gloo threads (Linux; [] elsewhere)."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return []
    names = []
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:  # the thread ended meanwhile
            pass
    return sorted(n for n in names if n.startswith(("pt_gloo", "gloo_tcp", "pt_tcpstore")))


if __name__ == "__main__":
    main()
