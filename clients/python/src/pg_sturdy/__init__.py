"""pg_sturdy from Python: every SQL function of the extension as a typed
method (`Sturdy`, `AsyncSturdy`), a worker (`Worker`) whose handlers run
steps that replay from checkpoints (`Pass.step`, `Pass.transact`,
`Pass.wait_for`), and the contract's errors as exceptions."""
from .calls import (BatchRun, Checkpoint, Chunk, Emitted, Node, Pumped, QueueStats, Receipt, Recorded, Signal,
                    Status, Stuck, Taken)
from .client import AsyncSturdy, Sturdy
from .errors import Conflict, Fenced, InvalidArgument, MissingObject, SturdyError
from .worker import Pass, WaitTimeout, Worker

__version__ = "0.2.0"

__all__ = [
    "AsyncSturdy", "BatchRun", "Checkpoint", "Chunk", "Conflict", "Emitted", "Fenced", "InvalidArgument",
    "MissingObject", "Node", "Pass", "Pumped", "QueueStats", "Receipt", "Recorded", "Signal", "Status", "Stuck", "Sturdy",
    "SturdyError", "Taken", "WaitTimeout", "Worker",
]
