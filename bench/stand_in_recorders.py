"""Stand-in recorders for bench/recording_overhead.py: `NoRecorder` (the loop's calls, nothing
done), and the floors under any recording of every update: `CopyFloor` (the weights and the
gradient copied into reused buffers) and `WriteFloor` (those copies also written to a file by a
background thread)."""

from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import Any

import torch


class NoRecorder:
    """Takes the loop's calls and does nothing with them."""

    def micro(self, loss: Any, items: Any = None, batch: Any = None) -> None:
        pass

    def grads(self, pre_clip_norm: Any = None) -> None:
        pass

    def update(self, loss_scale: Any = None) -> None:
        pass


class CopyFloor(NoRecorder):
    """Per update one copy of the weights and of the gradient into reused buffers, as the
    Recorder takes them, and nothing else: the least a recording of every update does on the
    training thread."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.params = list(model.parameters())
        self.buffers: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None
        self.copied = False

    @staticmethod
    def _host(param: torch.Tensor) -> torch.Tensor:
        """A host buffer like `param` (pinned for a CUDA parameter, as the Recorder's are)."""
        return torch.empty(param.shape, dtype=param.dtype, pin_memory=param.is_cuda)

    def _take(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Buffers for one update's weights and gradient (here: the same ones every update)."""
        if self.buffers is None:
            self.buffers = (
                [self._host(p) for p in self.params],
                [self._host(p) for p in self.params],
            )
        return self.buffers

    def _copied(self, buffers: tuple[list[torch.Tensor], list[torch.Tensor]]) -> None:
        """One update's copies are complete."""

    def grads(self, pre_clip_norm: Any = None) -> None:
        self.current = self._take()
        with torch.no_grad():
            for buffer, param in zip(self.current[1], self.params, strict=True):
                if param.grad is not None:
                    buffer.copy_(param.grad, non_blocking=True)
        self.copied = True

    def update(self, loss_scale: Any = None) -> None:
        if not self.copied:  # the loop did not call grads(): the step left the gradient as is
            self.grads()
        with torch.no_grad():
            for buffer, param in zip(self.current[0], self.params, strict=True):
                buffer.copy_(param, non_blocking=True)
        self.copied = False
        self._copied(self.current)

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


class WriteFloor(CopyFloor):
    """`CopyFloor`'s copies, each update's written to one file by a background thread (buffers
    from a pool, as the Recorder's): the least a recording of every update in full does. No
    header, checksum, fingerprint, loss, sample digest, lock, manifest or swap; `close()` waits
    for the last file."""

    def __init__(self, model: torch.nn.Module, folder: Path) -> None:
        super().__init__(model)
        self.folder = folder
        folder.mkdir(parents=True)
        self.pool: queue.SimpleQueue = queue.SimpleQueue()
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.written = 0
        self.thread = threading.Thread(target=self._write, daemon=True)
        self.thread.start()

    def _take(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        try:
            return self.pool.get_nowait()
        except queue.Empty:
            return [self._host(p) for p in self.params], [self._host(p) for p in self.params]

    def _copied(self, buffers: tuple[list[torch.Tensor], list[torch.Tensor]]) -> None:
        landed = None
        if self.params[0].is_cuda:  # the writer waits for the asynchronous copies, not this thread
            landed = torch.cuda.Event()
            landed.record()
        self.jobs.put((self.folder / f"update_{self.written:06d}.bin", buffers, landed))
        self.written += 1

    def _write(self) -> None:
        while (job := self.jobs.get()) is not None:
            path, buffers, landed = job
            if landed is not None:
                landed.synchronize()
            with open(path, "wb") as handle:
                for tensor in (*buffers[0], *buffers[1]):
                    handle.write(memoryview(tensor.numpy()).cast("B"))
            self.pool.put(buffers)

    def close(self) -> None:
        self.jobs.put(None)
        self.thread.join()
