//! Time-boxed property fuzzing of the decoders of untrusted bytes, for the
//! test suites of the crates that own those decoders, and hostile inputs
//! they share.
//!
//! Each fuzz target runs random cases from a proptest strategy until its
//! time budget is spent: `MC_FUZZ_SECS` seconds (default 2, so a plain
//! `cargo test` stays quick; the project's test command sets 30). A failing
//! case is shrunk by proptest and reported with the target's name. Inputs
//! are raw bytes and mutations of valid encodings ([`mutated`]), so the
//! decoders are exercised both at their first byte and deep inside.
//!
//! Compiled only with the `fuzz` feature (a dev-dependency feature).

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use std::fmt::Debug;
use std::time::{Duration, Instant};

/// This run's budget per fuzz target: `MC_FUZZ_SECS` (default 2 s).
pub fn budget() -> Duration {
    let secs = std::env::var("MC_FUZZ_SECS")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .unwrap_or(2.0);
    Duration::from_secs_f64(secs)
}

/// Run `test` on cases from `strategy` until the budget is spent (at
/// least one batch); panics with the shrunk failing case.
pub fn run<S>(name: &str, strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>)
where
    S: Strategy,
    S::Value: Debug,
{
    const BATCH: u32 = 128;
    let start = Instant::now();
    let deadline = start + budget();
    let mut cases = 0u64;
    loop {
        let mut runner = TestRunner::new(Config {
            cases: BATCH,
            failure_persistence: None,
            ..Config::default()
        });
        if let Err(e) = runner.run(&strategy, &test) {
            panic!("fuzz target {name} failed: {e}");
        }
        cases += u64::from(BATCH);
        if Instant::now() >= deadline {
            break;
        }
    }
    eprintln!(
        "fuzz {name}: {cases} cases in {:.1} s",
        start.elapsed().as_secs_f64()
    );
}

/// Arbitrary bytes, up to `max` long.
pub fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..=max)
}

/// One edit of a byte string.
#[derive(Debug, Clone)]
pub enum Edit {
    /// Overwrite the byte at (index modulo length).
    Set(usize, u8),
    /// Insert a byte at (index modulo length + 1).
    Insert(usize, u8),
    /// Remove the byte at (index modulo length).
    Remove(usize),
    /// Keep only the first (index modulo length + 1) bytes.
    Truncate(usize),
    /// Overwrite 4 bytes at (index modulo length) with a little-endian
    /// `u32` (to hit length and tag fields with large values).
    Word(usize, u32),
}

fn apply(mut b: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
    for e in edits {
        let n = b.len();
        match *e {
            Edit::Set(i, v) if n > 0 => b[i % n] = v,
            Edit::Insert(i, v) => b.insert(i % (n + 1), v),
            Edit::Remove(i) if n > 0 => {
                b.remove(i % n);
            }
            Edit::Truncate(i) => b.truncate(i % (n + 1)),
            Edit::Word(i, w) if n >= 4 => {
                let at = i % (n - 3);
                b[at..at + 4].copy_from_slice(&w.to_le_bytes());
            }
            _ => {}
        }
    }
    b
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, v)| Edit::Set(i, v)),
        (any::<usize>(), any::<u8>()).prop_map(|(i, v)| Edit::Insert(i, v)),
        any::<usize>().prop_map(Edit::Remove),
        any::<usize>().prop_map(Edit::Truncate),
        (
            any::<usize>(),
            prop_oneof![Just(0u32), Just(u32::MAX), Just(1 << 31), any::<u32>()]
        )
            .prop_map(|(i, w)| Edit::Word(i, w)),
    ]
}

/// One of `seeds` (valid encodings) with up to 8 random edits.
pub fn mutated(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    assert!(!seeds.is_empty(), "mutated() needs at least one seed");
    let n = seeds.len();
    (0..n, proptest::collection::vec(edit(), 0..8))
        .prop_map(move |(i, edits)| apply(seeds[i].clone(), &edits))
}

/// Raw bytes or mutated seeds, half and half.
pub fn inputs(seeds: Vec<Vec<u8>>, max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![bytes(max), mutated(seeds)]
}

/// The body of a request frame (after an empty list of finished read
/// tickets) in which the old `WithDone` envelope (variant 9, with an empty
/// list) wraps itself `depth` times around `RemoveAll { force: false }`
/// (variant 13): a decoder must refuse it without recursing.
pub fn nested_request_body(depth: usize) -> Vec<u8> {
    let mut body = 0u64.to_le_bytes().to_vec();
    for _ in 0..depth {
        body.extend_from_slice(&9u32.to_le_bytes());
        body.extend_from_slice(&0u64.to_le_bytes());
    }
    body.extend_from_slice(&13u32.to_le_bytes());
    body.push(0);
    body
}
