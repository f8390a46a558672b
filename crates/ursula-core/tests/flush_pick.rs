//! Which hot bytes a flush takes (`GroupState::pick_flush`, cluster.md §6.2): small tails wait
//! while enough large runs are hot, the largest streams go first when not all fit, an object
//! never passes its size, and every picked range and its planned bytes are hot.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

mod cold_world;

use cold_world::{World, key};
use proptest::prelude::*;
use std::collections::HashMap;
use ursula_core::cold::{FlushRule, Piece};

const STREAMS: usize = 8;

fn name(i: usize) -> String {
    format!("s{i}")
}

/// A world whose streams got `appends` (stream, length; `external` ones stored cold first).
fn world(appends: &[(usize, usize, bool)]) -> World {
    let mut w = World::new();
    for &(s, n, external) in appends {
        if external {
            w.append_external(&name(s), n, 0);
        } else {
            w.append(&name(s), n);
        }
    }
    w
}

fn rule(min_run: u64, min_ready: u64, any_at: u64, max_bytes: u64) -> FlushRule {
    FlushRule {
        min_run,
        min_ready,
        any_at,
        max_bytes,
    }
}

#[test]
fn small_tails_wait_while_large_runs_fill_an_object() {
    let w = world(&[(0, 100, false), (1, 5_000, false), (2, 3_000, false)]);
    let p = w.g.pick_flush(&rule(1_000, 4_000, 100_000, 1 << 20));
    assert_eq!((p.hot, p.ready), (8_100, 8_000));
    let mut keys: Vec<_> = p.picked.iter().map(|c| c.key.clone()).collect();
    keys.sort();
    let mut want = vec![key("s1"), key("s2")];
    want.sort();
    assert_eq!(keys, want, "the tail waits");
}

#[test]
fn nothing_moves_below_both_thresholds() {
    let w = world(&[(0, 100, false), (1, 5_000, false)]);
    let p = w.g.pick_flush(&rule(1_000, 6_000, 10_000, 1 << 20));
    assert_eq!((p.hot, p.ready), (5_100, 5_000));
    assert!(p.picked.is_empty());
}

#[test]
fn a_group_of_tiny_streams_flushes_them_all_once_it_holds_enough() {
    let w = world(&[(0, 100, false), (1, 300, false), (2, 200, false)]);
    let p = w.g.pick_flush(&rule(1_000, 4_000, 600, 1 << 20));
    assert_eq!(p.ready, 0);
    let mut runs: Vec<_> = p.picked.iter().map(|c| (c.key.clone(), c.end)).collect();
    runs.sort();
    let mut want = vec![(key("s0"), 100), (key("s1"), 300), (key("s2"), 200)];
    want.sort();
    assert_eq!(runs, want);
}

#[test]
fn an_object_that_cannot_take_all_takes_the_largest_and_is_cut_at_its_size() {
    let w = world(&[(3, 300, false), (1, 500, false), (2, 400, false)]);
    let p = w.g.pick_flush(&FlushRule::any(700));
    let runs: Vec<_> = p
        .picked
        .iter()
        .map(|c| (c.key.clone(), c.start, c.end))
        .collect();
    assert_eq!(runs, vec![(key("s1"), 0, 500), (key("s2"), 0, 200)]);
    let planned: usize = p
        .bytes
        .iter()
        .map(|b| match b {
            Piece::Hot(b) => b.len(),
            Piece::Cold { .. } => panic!("a planned piece is cold"),
        })
        .sum();
    assert_eq!(planned, 700);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_pick_follows_its_rule(
        appends in prop::collection::vec((0..STREAMS, 1usize..5_000, prop::bool::weighted(0.2)), 0..24),
        min_run in 1u64..6_000,
        min_ready in 1u64..20_000,
        any_at in 1u64..40_000,
        max_bytes in 1u64..30_000,
    ) {
        let w = world(&appends);
        let p = w.g.pick_flush(&rule(min_run, min_ready, any_at, max_bytes));
        let hot: HashMap<_, u64> = w
            .g
            .streams
            .iter()
            .filter(|(_, s)| s.hot_len() > 0)
            .map(|(k, s)| (k.clone(), s.hot_len()))
            .collect();
        prop_assert_eq!(p.hot, hot.values().sum::<u64>());
        prop_assert_eq!(p.ready, hot.values().filter(|&&n| n >= min_run).sum::<u64>());
        let only_large = p.ready >= min_ready;
        let eligible: u64 = if only_large {
            p.ready
        } else if p.hot >= any_at {
            p.hot
        } else {
            0
        };
        // An object takes as much as it may: all that is eligible, or its size.
        let total: u64 = p.picked.iter().map(|c| c.end - c.start).sum();
        prop_assert_eq!(total, eligible.min(max_bytes));
        // The planned bytes are exactly the picked ranges' (each range's own bytes are
        // checked against the plan below).
        let mut planned = Vec::new();
        for b in &p.bytes {
            match b {
                Piece::Hot(b) => planned.extend_from_slice(b),
                Piece::Cold { .. } => prop_assert!(false, "a planned piece is cold"),
            }
        }
        let mut want = Vec::new();
        // When not all fit: streams in order of hot bytes, most first, and no skipped
        // eligible stream holds more than the last one picked.
        let mut order: Vec<(ursula_core::StreamKey, u64)> = Vec::new();
        for c in &p.picked {
            if order.last().is_none_or(|(k, _)| *k != c.key) {
                order.push((c.key.clone(), hot[&c.key]));
            }
            let s = &w.g.streams[&c.key];
            prop_assert_eq!(c.incarnation, s.incarnation);
            let mut plan = Vec::new();
            prop_assert!(s.plan_own(c.start, c.end, &mut plan));
            for piece in plan {
                match piece {
                    Piece::Hot(b) => want.extend_from_slice(&b),
                    Piece::Cold { .. } => prop_assert!(false, "a picked range is cold"),
                }
            }
        }
        prop_assert!(planned == want, "the planned bytes are not the picked ranges'");
        if only_large {
            prop_assert!(order.iter().all(|(_, n)| *n >= min_run));
        }
        if eligible > max_bytes {
            prop_assert!(order.windows(2).all(|w| w[0].1 >= w[1].1));
        }
        if let Some((_, last)) = order.last().filter(|_| eligible > max_bytes) {
            let picked: Vec<_> = order.iter().map(|(k, _)| k).collect();
            for (k, n) in &hot {
                if !picked.contains(&k) && (!only_large || *n >= min_run) {
                    prop_assert!(n <= last, "{k:?} holds {n} > {last}, yet was skipped");
                }
            }
        }
    }
}
