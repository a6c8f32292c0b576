"""pg_sturdy from Python: every SQL function of the extension as a typed
method (`Sturdy`, `AsyncSturdy`); workers (`Worker`, `AsyncWorker`) whose
handlers run steps that replay from checkpoints (`Pass.step`,
`Pass.transact`, `Pass.wait_for`, `Pass.sleep`); a registry of handlers by
process that starts workflows and waits for their results (`App`,
`Handle`); acknowledgements of taken jobs sent together (`AsyncAcks`);
and the contract's errors as exceptions.

    python -m pg_sturdy worker mymodule:app --queue orders --concurrency 8 --drain 30s
"""
from .acks import AsyncAcks
from .aio import AsyncPass, AsyncWorker
from .app import App, AsyncHandle, Handle, NoHandler, WorkflowCancelled, WorkflowFailed
from .calls import (BatchRun, Checkpoint, Chunk, Emitted, Node, Pumped, QueueStats, Receipt, Recorded, Signal,
                    Status, Stuck, Taken, Watched)
from .client import AsyncSturdy, Sturdy
from .errors import Conflict, Fenced, InvalidArgument, MissingObject, SturdyError
from .passes import DoNotRetry, Instance, NotJSON, RetryAfter, WaitTimeout, encode
from .worker import Pass, Worker, WorkerFailed

__version__ = "0.2.0"

__all__ = [
    "App", "AsyncAcks", "AsyncHandle", "AsyncPass", "AsyncSturdy", "AsyncWorker", "BatchRun", "Checkpoint", "Chunk", "Conflict",
    "DoNotRetry", "Emitted", "Fenced", "Handle", "Instance", "InvalidArgument", "MissingObject", "NoHandler", "Node",
    "NotJSON", "Pass", "Pumped", "QueueStats", "Receipt", "Recorded", "RetryAfter", "Signal", "Status", "Stuck",
    "Sturdy", "SturdyError", "Taken", "WaitTimeout", "Watched", "Worker", "WorkerFailed", "WorkflowCancelled",
    "WorkflowFailed", "encode",
]
