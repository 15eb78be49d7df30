"""Data parallel for one torch cell: DistributedDataParallel under torchrun, one process per worker.

harness/run/launch.py starts an N-worker cell as `python -m torch.distributed.run --standalone --nproc-per-node N
-m amp_compare.torch_impl ...`; each worker runs train() (torch_impl/train.py) with the `Worker` from `start(cfg)`:
  * the process group from torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR/PORT): gloo on a CPU, NCCL on CUDA
    with one GPU per worker (LOCAL_RANK); on a CPU the cell's --threads are shared among the workers;
  * the model wrapped in DistributedDataParallel; the gradient all-reduce in --allreduce's precision through DDP's
    own communication hooks (default_hooks.fp16_compress_hook / bf16_compress_hook, which divide by the world size
    before reducing); fp32 is DDP's built-in all-reduce;
  * each step's global batch (kit/data.py's seeded plan, the 1-worker batch) cut in N contiguous slices: worker k
    trains on slice k, so the N-worker run is the 1-worker experiment; GradScaler then sees the all-reduced
    gradients, the same on every worker, and takes the same skip decision everywhere;
  * loop.run_epoch hands the epoch's steps to the run's StepBook once, at the epoch's end (`read_every`), through
    `WorkersBook`: every worker's losses, loss scales and skipped flags are gathered (outside the timed steps), the
    book records their mean loss (the global batch's, what a 1-worker run records), and rank 0 alone writes the
    records (kit/child.py) — the per-worker table `workers` is how a reader sees that the workers agreed;
  * after training, one profiled forward/backward of the DDP model reads back the dtype the backend all-reduced in
    (gloo's / NCCL's own record of the tensor: `input_dtypes` of its all_reduce event), and DDP's own timing of the
    backward's communication is recorded.
A 1-worker cell gets `Single`, which changes nothing.
"""

from __future__ import annotations

import ctypes
import os
import signal

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from amp_compare.contract.config import RunConfig
from amp_compare.kit.training import StepBook
from amp_compare.torch_impl.amp import mixed_precision

# --allreduce -> the name of DDP's communication hook in default_hooks (None: DDP's built-in all-reduce of the
# float32 gradient buckets)
COMM_HOOKS = {"fp32": None, "fp16": "fp16_compress_hook", "bf16": "bf16_compress_hook"}
# c10 scalar type names, as the profiler records a collective's input, in the project's words
DTYPE_NAMES = {"float": "float32", "c10::Half": "float16", "c10::BFloat16": "bfloat16", "double": "float64"}
PR_SET_PDEATHSIG = 1


class Single:
    """A 1-worker cell: no process group, everything as it is."""

    rank, world = 0, 1

    def __init__(self, cfg: RunConfig):
        self.device = torch.device(cfg.device)

    def wrap(self, run):
        return run

    def book(self, book: StepBook) -> StepBook:
        return book

    def shard(self, plan: torch.Tensor) -> torch.Tensor:
        return plan

    def read_every(self, steps: int) -> int | None:
        return None  # loop.run_epoch's own choice

    def finish(self, result, first_batch: tuple, precision: str) -> None:
        pass


def comm_hook(allreduce: str):
    """DDP's own communication hook for an all-reduce precision (None: DDP's built-in float32 all-reduce)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return getattr(default_hooks, COMM_HOOKS[allreduce]) if COMM_HOOKS[allreduce] else None


def start(cfg: RunConfig) -> Single | Worker:
    """The cell's worker: `Single` for one worker, else this process's place in the torchrun launch."""
    return Single(cfg) if cfg.replicas == 1 else Worker(cfg)


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this worker when torchrun dies (a harness that kills torchrun, or torchrun killed
    itself, leaves no orphan training on), and stop now if torchrun is already gone."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the harness's kill_tree still stops the workers
        return
    if os.getppid() == 1:
        os._exit(1)


class Worker:
    """One worker of an N-worker torch cell (see the module docstring)."""

    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world != cfg.replicas:
            raise RuntimeError(f"cell wants {cfg.replicas} workers but this process is one of {world}: start it "
                               "with python -m torch.distributed.run --nproc-per-node "
                               f"{cfg.replicas} (harness/run/launch.py does)")
        die_with_parent()
        if cfg.device == "cuda":
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        else:  # the cell's threads shared among its workers, so N workers use the cores one worker would
            torch.set_num_threads(max(1, cfg.threads // world))
        dist.init_process_group("nccl" if cfg.device == "cuda" else "gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.device = torch.device("cuda", torch.cuda.current_device()) if cfg.device == "cuda" else torch.device("cpu")
        self.rows: list[dict] = []
        self.steps_done = 0
        self.ddp: DistributedDataParallel | None = None

    def wrap(self, run):
        """The compiled run (train.Compiled) with DDP around its model and --allreduce's communication hook as the
        network the step calls; compiled again where the cell compiles (torch.compile of the DDP module: DDP's
        recommended order)."""
        self.ddp = DistributedDataParallel(run.model, device_ids=[self.device.index] if self.device.type == "cuda"
                                           else None)
        hook = comm_hook(self.cfg.allreduce)
        if hook is not None:
            self.ddp.register_comm_hook(None, hook)  # None: the default (whole world) process group
        net = self.ddp if run.net is run.model else torch.compile(
            self.ddp, mode="reduce-overhead" if run.graphs else "default")
        return run._replace(net=net)

    def book(self, book: StepBook) -> WorkersBook:
        """The run's StepBook behind every worker's steps (WorkersBook)."""
        return WorkersBook(self, book)

    def read_every(self, steps: int) -> int:
        """The epoch's steps reach the book once, at its end: gathering every worker's values is a collective,
        kept out of the timed steps (the book's divergence verdict, taken on the gathered values, is then the
        same on every worker, so none stops while another waits in the next all-reduce)."""
        return steps

    def shard(self, plan: torch.Tensor) -> torch.Tensor:
        """This worker's contiguous slice of every step's global batch (plan: steps x batch indices)."""
        per = plan.shape[1] // self.world
        return plan[:, self.rank * per:(self.rank + 1) * per]

    def gather(self, losses: list[float], scales: list[float], skipped: list[bool]) -> np.ndarray:
        """Every worker's losses, scales and skipped flags of the same steps: (worker, [loss, scale, skipped], step);
        their rows kept for the `workers` table."""
        local = torch.tensor(np.array([losses, scales, np.asarray(skipped, float)]), dtype=torch.float64,
                             device=self.device)
        gathered = [torch.empty_like(local) for _ in range(self.world)]
        dist.all_gather(gathered, local)
        values = torch.stack(gathered).cpu().numpy()
        for worker in range(self.world):
            for i in range(values.shape[2]):
                self.rows.append({"worker": worker, "step": self.steps_done + i, "loss": float(values[worker, 0, i]),
                                  "loss_scale": float(values[worker, 1, i]), "skipped": bool(values[worker, 2, i]),
                                  "local_nonfinite": float("nan")})  # GradScaler sees only all-reduced grads
        self.steps_done += values.shape[2]
        return values

    def total(self, count: int) -> int:
        """A count summed over the workers (correct predictions of the global batch)."""
        value = torch.tensor([count], dtype=torch.int64, device=self.device)
        dist.all_reduce(value)
        return int(value.item())

    def readback(self, x: torch.Tensor, y: torch.Tensor, precision: str) -> dict:
        """One profiled forward/backward of the DDP model on this worker's slice of a batch (eval mode: BatchNorm's
        running statistics stay as they are; no optimizer step), read for the dtype and size of what the backend
        all-reduced. The gradients it leaves are cleared."""
        import torch.nn.functional as F
        from torch.profiler import ProfilerActivity, profile

        per = len(x) // self.world
        xb, yb = x[self.rank * per:(self.rank + 1) * per], y[self.rank * per:(self.rank + 1) * per]
        was_training = self.ddp.training
        self.ddp.eval()
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            with mixed_precision(precision, self.device.type):  # AMP: as the training step's forward
                loss = F.cross_entropy(self.ddp(xb), yb)
            loss.backward()
            if self.device.type == "cuda":
                torch.cuda.synchronize()
        self.ddp.train(was_training)
        for p in self.ddp.parameters():
            p.grad = None
        events = [e for e in prof.events() if e.name.endswith(":all_reduce")]  # gloo:all_reduce, nccl:all_reduce
        dtypes = sorted({DTYPE_NAMES.get(t, t) for e in events for t in (getattr(e, "input_dtypes", None) or [])
                         if t})
        elements = sum(int(np.prod(shape)) for e in events for shape in e.input_shapes if shape)
        return {"allreduce_dtype": ",".join(dtypes) or "not recorded", "allreduce_calls": len(events),
                "allreduce_elements": elements, "allreduce_readback": f"torch.profiler: {events[0].name} input dtype"
                if events else "torch.profiler: no all_reduce event"}

    def finish(self, result, first_batch: tuple, precision: str) -> None:
        """Read back what the all-reduce did, record the workers' values, leave the process group."""
        info = self.readback(*first_batch, precision)
        timing = self.ddp._get_ddp_logging_data()  # DDP's own timing of sampled iterations, in ns
        comm = timing.get("avg_backward_comm_time")
        hook = COMM_HOOKS[self.cfg.allreduce]
        result.info.update({
            "data_parallel": f"torchrun + DistributedDataParallel ({dist.get_backend()})",
            "world_size": self.world, "allreduce_requested": self.cfg.allreduce,
            "allreduce_hook": f"default_hooks.{hook}" if hook else "DDP built-in all-reduce",
            **info,
            "allreduce_time_s": comm / 1e9 if comm else float("nan"),
            "allreduce_time_source": "DDP avg_backward_comm_time (sampled iterations; includes waiting for the "
                                     "slowest worker)",
            "threads_per_worker": torch.get_num_threads() if self.device.type == "cpu" else 0,
        })
        result.workers = self.rows
        dist.barrier()
        dist.destroy_process_group()



class WorkersBook:
    """The run's StepBook as the global batch sees it (kit/training.py), for one worker of an N-worker cell: each
    batch of steps handed to add() is gathered from every worker first; the book records their mean loss (the
    global batch's, what a 1-worker run records) and this worker's scale and skipped flag (the `workers` table
    shows whether all agreed); the correct predictions of an epoch are summed over the workers."""

    def __init__(self, worker: Worker, book: StepBook):
        self.worker, self.inner = worker, book

    @property
    def epoch(self) -> int:
        return self.inner.epoch

    def start_epoch(self, epoch: int, steps: int) -> None:
        self.inner.start_epoch(epoch, steps)

    def headroom(self, rows: list[dict]) -> None:
        self.inner.headroom(rows)  # a vit's maxima as this worker saw them (its slice of each global batch)

    def add(self, losses: list[float], scales: list[float], skipped: list[bool]) -> bool:
        values = self.worker.gather(losses, scales, skipped)
        return self.inner.add(values[:, 0, :].mean(axis=0).tolist(), scales, skipped)

    def end_epoch(self, step_times: list[float], train_time_s: float, eval_time_s: float, correct: int,
                  val_loss: float, val_accuracy: float) -> None:
        self.inner.end_epoch(step_times, train_time_s, eval_time_s, self.worker.total(correct), val_loss,
                             val_accuracy)
