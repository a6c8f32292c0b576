//! The calls that span capabilities, composed from the capabilities' public
//! operations; none names another room's tables or columns, and no
//! capability names another (`make lint`, `scripts/rooms.py`):
//! - `take`: the queue's lease, with `claim` each workflow claimed too;
//! - `fenced`: `record`, `transact` and `transition` with a token: the
//!   claim's fence, then a checkpoint, an effect, an instance's move;
//! - `finish`: the fence, a step, the claim released, the queue row done and
//!   the instance moved, in one call;
//! - `scheduled`: `start` and `arrive`, a write and its workflow's schedule
//!   in one transaction;
//! - `failing`: `fail` and `cancel`, and a row's death in a take: the
//!   queue's part, then the instance failed or the claim fenced out.

mod failing;
mod fenced;
mod finish;
mod scheduled;
mod sweep;
mod take;
