//! The furthest floor any backend's take reached in a queue, shared by every
//! backend of the server: on PostgreSQL 17 and later in a named segment of
//! the server's dynamic shared memory, made on first use; on 15 in its main
//! shared memory, where the library is in `shared_preload_libraries` (not
//! preloaded there, each backend goes by its own floors, as before).
//!
//! Each backend keeps its own floor per queue (`queue/floor.rs`, `Floor`): the
//! place of the row its last take found, below which everything was handed
//! out or held when it looked. Under a backlog the rows between one
//! backend's floor and the queue's head are the ones the others took since,
//! leased or done and not yet vacuumed, and each take walked them again (at
//! 16 clients on two cores, 12 index entries and 7.6 heap versions a take
//! against 5.2 and 2.8 at 4). A floor another backend reached holds by the
//! same argument as one's own, for the same generation: so a take starts at
//! the furthest of its own floor and the shared one, where that one was found
//! under the generation it reads now.
//!
//! The slot also holds when a backend last claimed the queue's periodic scan
//! from the start ([`claim_scan`]): that scan, which finds rows left below
//! the floors, walks the whole dead front of the queue's index, and run once
//! a second by every backend it cost 16 times as much at 16 workers as at
//! one. Claimed in the slot, one backend of the server runs it once a second
//! for all. Everything else about floors stays each backend's (its first
//! scan, what a short take does).
//!
//! A slot per queue name (by hash, among [`SLOTS`]; names of more than
//! [`NAME_BYTES`] bytes are not shared), written under a sequence counter
//! that is odd while one writer holds it: a reader that sees it odd, or
//! changed while it read, finds nothing; a writer that cannot take it at
//! once does not write. Only ever a hint that may be missing: a take that
//! finds none starts at its own floor, as it did before.

use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};

use pgrx::pg_sys;

use crate::rescan::Position;

/// Slots in the segment (queues that share one take turns).
const SLOTS: usize = 512;
/// The longest queue name shared, in bytes.
const NAME_BYTES: usize = 64;
const NAME_WORDS: usize = NAME_BYTES / 8;

/// One queue's shared floor. Every field is an atomic, written only by the
/// writer that holds `version` odd.
#[repr(C, align(64))]
struct Slot {
    version: AtomicU64,
    database: AtomicU32,
    /// `sturdy.queue_generation`'s OID: another installation of the
    /// extension in the same database is another set of queues.
    generations: AtomicU32,
    /// The name's length plus one (0: an empty slot).
    len: AtomicU32,
    name: [AtomicU64; NAME_WORDS],
    generation: AtomicI64,
    at: AtomicI64,
    tiebreak: AtomicI64,
    /// When a backend last claimed the periodic scan from the start of the
    /// queue (`clock_timestamp()`'s µs; 0: never). Written under `version`
    /// held odd, as the rest.
    scanned: AtomicI64,
}

#[repr(C)]
struct Heads {
    slots: [Slot; SLOTS],
}

/// Which queue a slot is for, and its slot.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Queue {
    database: u32,
    generations: u32,
    len: u32,
    name: [u64; NAME_WORDS],
    slot: usize,
}

impl Queue {
    /// `None` for a name too long to share, or where this server has no
    /// slots.
    pub fn new(generations: pg_sys::Oid, name: &[u8]) -> Option<Queue> {
        if name.len() > NAME_BYTES || segment().is_none() {
            return None;
        }
        let mut words = [0u64; NAME_WORDS];
        for (i, chunk) in name.chunks(8).enumerate() {
            let mut bytes = [0u8; 8];
            bytes[..chunk.len()].copy_from_slice(chunk);
            words[i] = u64::from_le_bytes(bytes);
        }
        // SAFETY: the backend's database, set once at connection.
        let database = unsafe { pg_sys::MyDatabaseId };
        let mut q = Queue {
            database: database.to_u32(),
            generations: generations.to_u32(),
            len: name.len() as u32 + 1,
            name: words,
            slot: 0,
        };
        q.slot = q.hash();
        Some(q)
    }

    fn hash(&self) -> usize {
        // FNV-1a over the identity
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut mix = |v: u64| {
            for b in v.to_le_bytes() {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
        };
        mix(u64::from(self.database) << 32 | u64::from(self.generations));
        mix(u64::from(self.len));
        self.name.iter().for_each(|&w| mix(w));
        (h % SLOTS as u64) as usize
    }
}

impl Slot {
    fn holds(&self, q: &Queue) -> bool {
        self.database.load(Ordering::Relaxed) == q.database
            && self.generations.load(Ordering::Relaxed) == q.generations
            && self.len.load(Ordering::Relaxed) == q.len
            && self
                .name
                .iter()
                .zip(q.name)
                .all(|(a, b)| a.load(Ordering::Relaxed) == b)
    }

    /// The generation and floor in the slot where it is `q`'s, field by
    /// field: whole only under the version's check, or for its writer.
    fn fields(&self, q: &Queue) -> Option<(i64, Position)> {
        self.holds(q).then(|| {
            (
                self.generation.load(Ordering::Relaxed),
                (
                    self.at.load(Ordering::Relaxed),
                    self.tiebreak.load(Ordering::Relaxed),
                ),
            )
        })
    }

    /// The floor held for `q`, and the generation it holds for, read whole.
    fn read(&self, q: &Queue) -> Option<(i64, Position)> {
        let before = self.version.load(Ordering::Acquire);
        if before % 2 == 1 {
            return None;
        }
        let found = self.fields(q);
        std::sync::atomic::fence(Ordering::Acquire);
        (self.version.load(Ordering::Relaxed) == before)
            .then_some(found)
            .flatten()
    }
}

thread_local! {
    /// The segment, once this backend has attached it.
    static SEGMENT: std::cell::Cell<Option<&'static Heads>> = const { std::cell::Cell::new(None) };
}

/// The segment (made by the first backend to ask); `None` where the server
/// has no registry of named segments (PostgreSQL 15).
fn segment() -> Option<&'static Heads> {
    if let Some(heads) = SEGMENT.with(std::cell::Cell::get) {
        return Some(heads);
    }
    let heads = attach()?;
    SEGMENT.with(|s| s.set(Some(heads)));
    Some(heads)
}

/// Whether this server loaded the library at its start
/// (`shared_preload_libraries`), and so holds room for the slots in its main
/// shared memory (PostgreSQL 15, which has no registry of named segments).
#[cfg(feature = "pg15")]
static PRELOADED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

#[cfg(feature = "pg15")]
static mut PREVIOUS_REQUEST: pg_sys::shmem_request_hook_type = None;

/// From `_PG_init`: where the server is loading us at its start, ask for
/// the slots' room in its shared memory (PostgreSQL 15; later versions make
/// a segment on first use, preloaded or not).
pub fn preload() {
    #[cfg(feature = "pg15")]
    // SAFETY: the postmaster runs `_PG_init` of a preloaded library before
    // any backend exists, and chains the hook as every extension does.
    unsafe {
        #[pgrx::pg_guard]
        unsafe extern "C-unwind" fn request() {
            // SAFETY: called by the postmaster once, while shared memory is
            // being sized; the previous hook is whatever was there.
            unsafe {
                if let Some(previous) = PREVIOUS_REQUEST {
                    previous();
                }
                pg_sys::RequestAddinShmemSpace(size_of::<Heads>());
            }
        }
        if !pg_sys::process_shared_preload_libraries_in_progress {
            return;
        }
        PREVIOUS_REQUEST = pg_sys::shmem_request_hook;
        pg_sys::shmem_request_hook = Some(request);
        PRELOADED.store(true, Ordering::Relaxed);
    }
}

#[cfg(feature = "pg15")]
fn attach() -> Option<&'static Heads> {
    if !PRELOADED.load(Ordering::Relaxed) {
        return None;
    }
    let mut found = false;
    // SAFETY: the room was asked for at the server's start (`preload`; the
    // flag is inherited from the postmaster); the first backend to look
    // makes the struct, zeroed, under `AddinShmemInitLock`, as extensions
    // do in their start-up hooks; it stays for the server's life.
    unsafe {
        // AddinShmemInitLock (lwlocknames.h)
        let lock = &raw mut (*pg_sys::MainLWLockArray.add(21)).lock;
        pg_sys::LWLockAcquire(lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
        let at =
            pg_sys::ShmemInitStruct(c"pg_sturdy.heads".as_ptr(), size_of::<Heads>(), &mut found);
        if !found {
            std::ptr::write_bytes(at.cast::<u8>(), 0, size_of::<Heads>());
        }
        pg_sys::LWLockRelease(lock);
        (!at.is_null()).then(|| &*at.cast::<Heads>())
    }
}

#[cfg(not(feature = "pg15"))]
fn attach() -> Option<&'static Heads> {
    /// A new segment: every slot empty (all zeroes is that, for atomics).
    #[pgrx::pg_guard]
    unsafe extern "C-unwind" fn init(at: *mut std::ffi::c_void) {
        // SAFETY: the registry hands us the new segment, of our size, before
        // any other backend can see it.
        unsafe { std::ptr::write_bytes(at.cast::<u8>(), 0, size_of::<Heads>()) };
    }
    let mut found = false;
    // SAFETY: the registry makes the segment once (under its lock) and maps
    // it into this backend for the backend's life, so the reference lives as
    // long as we do; its contents are atomics only.
    unsafe {
        let at = pg_sys::GetNamedDSMSegment(
            c"pg_sturdy.heads".as_ptr(),
            size_of::<Heads>(),
            Some(init),
            &mut found,
        );
        (!at.is_null()).then(|| &*at.cast::<Heads>())
    }
}

/// The floor another backend reached in `q` under `generation`, if one did.
pub fn read(q: &Queue, generation: i64) -> Option<Position> {
    let slot = &segment()?.slots[q.slot];
    match slot.read(q) {
        Some((g, at)) if g == generation => Some(at),
        _ => None,
    }
}

/// Offer `at`, a floor this backend found in `q` under `generation`: kept
/// where the slot holds nothing further for that generation, or holds an
/// older generation or another queue. Not written when another backend is
/// writing the slot, or when it would change nothing.
pub fn offer(q: &Queue, generation: i64, at: Position) {
    let Some(heads) = segment() else {
        return;
    };
    let slot = &heads.slots[q.slot];
    let further = |held: Option<(i64, Position)>| match held {
        Some((g, held)) if g == generation => at > held,
        Some((g, _)) => g < generation,
        None => true,
    };
    let before = slot.version.load(Ordering::Acquire);
    if before % 2 == 1 || !further(slot.read(q)) {
        return;
    }
    if slot
        .version
        .compare_exchange(before, before + 1, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        return;
    }
    // held by us now: as it stands, is ours still further?
    if further(slot.fields(q)) {
        if !slot.holds(q) {
            // another queue's slot until now: its scans are not ours
            slot.scanned.store(0, Ordering::Relaxed);
        }
        slot.database.store(q.database, Ordering::Relaxed);
        slot.generations.store(q.generations, Ordering::Relaxed);
        slot.len.store(q.len, Ordering::Relaxed);
        for (a, b) in slot.name.iter().zip(q.name) {
            a.store(b, Ordering::Relaxed);
        }
        slot.generation.store(generation, Ordering::Relaxed);
        slot.at.store(at.0, Ordering::Relaxed);
        slot.tiebreak.store(at.1, Ordering::Relaxed);
    }
    slot.version.store(before + 2, Ordering::Release);
}

/// Whether this backend is to run the periodic scan from the start of `q`
/// that its own schedule says is due now (`now`, `clock_timestamp()`'s
/// µs; `every`, its schedule's interval): no, where another backend of the
/// server claimed one less than `every` ago; otherwise yes, and the claim is
/// its own. Yes wherever the slot cannot say (no slots, the slot another
/// queue's or being written, a clock that went back): a scan too many costs
/// time, a scan too few would leave a row below the floors waiting.
///
/// A skipped backend stays due by its own schedule and asks again on its
/// next take, so one backend runs the scan about every `every`, where each
/// ran it that often before.
pub fn claim_scan(q: &Queue, now: i64, every: i64) -> bool {
    let Some(heads) = segment() else {
        return true;
    };
    let slot = &heads.slots[q.slot];
    let recent = |last: i64| last <= now && now - last < every;
    let before = slot.version.load(Ordering::Acquire);
    if before % 2 == 1 || !slot.holds(q) {
        return true;
    }
    let last = slot.scanned.load(Ordering::Relaxed);
    std::sync::atomic::fence(Ordering::Acquire);
    if slot.version.load(Ordering::Relaxed) != before {
        return true;
    }
    if recent(last) {
        return false;
    }
    if slot
        .version
        .compare_exchange(before, before + 1, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        // another backend is writing the slot: perhaps this same claim
        return !recent(slot.scanned.load(Ordering::Relaxed));
    }
    // held by us now: still q's (it was at `before`), and still unclaimed?
    let claimed = !recent(slot.scanned.load(Ordering::Relaxed));
    if claimed {
        slot.scanned.store(now, Ordering::Relaxed);
    }
    slot.version.store(before + 2, Ordering::Release);
    claimed
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    use super::{Queue, claim_scan, offer, read};

    #[pg_test]
    fn a_floor_offered_is_read_for_its_generation_and_queue_only() {
        // (on 15 the slots need the library preloaded, as the tests' cluster has it)
        let q = Queue::new(pg_sys::Oid::from(4242), b"heads-test").expect("slots");
        let other = Queue::new(pg_sys::Oid::from(4242), b"heads-other").unwrap();
        let elsewhere = Queue::new(pg_sys::Oid::from(4243), b"heads-test").unwrap();
        offer(&q, 7, (100, 1));
        assert_eq!(read(&q, 7), Some((100, 1)));
        assert_eq!(read(&q, 8), None, "another generation");
        assert_eq!(read(&other, 7), None, "another queue");
        assert_eq!(read(&elsewhere, 7), None, "another installation");
        offer(&q, 7, (90, 5));
        assert_eq!(read(&q, 7), Some((100, 1)), "never back");
        offer(&q, 7, (100, 2));
        assert_eq!(read(&q, 7), Some((100, 2)), "on by the tiebreak");
        offer(&q, 6, (500, 0));
        assert_eq!(
            read(&q, 7),
            Some((100, 2)),
            "an older generation's does not count"
        );
        offer(&q, 8, (50, 0));
        assert_eq!(
            read(&q, 8),
            Some((50, 0)),
            "a newer generation's replaces it"
        );
        assert_eq!(read(&q, 7), None);
        assert!(Queue::new(pg_sys::Oid::from(4242), &[b'x'; 65]).is_none());
    }

    #[pg_test]
    fn one_backend_claims_a_queues_scan_from_the_start_per_interval() {
        let q = Queue::new(pg_sys::Oid::from(4244), b"claims-test").expect("slots");
        let second = 1_000_000;
        assert!(
            claim_scan(&q, 5 * second, second),
            "the slot is no queue's yet: scan"
        );
        assert!(
            claim_scan(&q, 5 * second, second),
            "nor after a scan: a slot says nothing for another queue"
        );
        offer(&q, 1, (100, 1));
        assert!(claim_scan(&q, 10 * second, second), "never claimed: ours");
        assert!(
            !claim_scan(&q, 10 * second + second / 2, second),
            "claimed half a second ago"
        );
        assert!(!claim_scan(&q, 11 * second - 1, second));
        assert!(
            claim_scan(&q, 11 * second, second),
            "a second on: ours again"
        );
        assert!(
            !claim_scan(&q, 11 * second, second),
            "and no one else's at that instant"
        );
        assert!(
            claim_scan(&q, 11 * second, 0),
            "an interval of nothing: always"
        );
        assert!(
            claim_scan(&q, 3 * second, second),
            "a clock gone back: scan"
        );
        // a queue whose name lands in the same slot takes it over: its scans start unclaimed
        let mut other = Queue::new(pg_sys::Oid::from(4244), b"claims-other").unwrap();
        other.slot = q.slot;
        offer(&other, 1, (100, 1));
        assert!(
            claim_scan(&other, 3 * second + 1, second),
            "the slot's claim was the other queue's"
        );
        assert!(
            claim_scan(&q, 3 * second + 2, second),
            "and q's slot is no longer q's"
        );
    }
}
