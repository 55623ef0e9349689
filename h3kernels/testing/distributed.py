"""Several processes on one machine as a torch.distributed group (gloo on the CPU, or NCCL): what the tests of
h3kernels.parallel run their ranks in.

    results = run_ranks(3, "tests.module", "function", args)  # function(rank, world, *args) in each

Each rank is a spawned process joined through a file:// rendezvous in a fresh directory; the
function's return value comes back through torch.save, one list entry per rank. A rank that
raises makes run_ranks raise (torch.multiprocessing reports its traceback), and every collective
has a timeout so that a rank left waiting does not hang the caller.
"""
import datetime
import importlib
import os
import tempfile

TIMEOUT_S = 60


def _entry(rank, world, init_file, module, function, args, out_dir, backend):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # ranks share the machine's cores
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=TIMEOUT_S))
    try:
        fn = getattr(importlib.import_module(module), function)
        result = fn(rank, world, *args)
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_ranks(world, module, function, args=(), backend="gloo"):
    """[function(rank, world, *args) for each rank], each run in its own process of a group of
    `world` ranks (gloo on the CPU; nccl: rank r on GPU r). module: an importable module name
    (its directory on sys.path)."""
    import torch
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="h3-ranks-") as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        mp.start_processes(_entry, args=(world, init_file, module, function, tuple(args), tmp, backend), nprocs=world,
                           join=True, start_method="spawn")
        return [torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=False) for r in range(world)]
