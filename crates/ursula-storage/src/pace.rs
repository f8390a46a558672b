//! Background writes at a pace the WAL's syncs do not feel.
//!
//! A snapshot or a local cold object written in one go leaves megabytes of dirty pages, and
//! the WAL's next `fdatasync` (which every acknowledgement waits for) queues behind their
//! write-back. Measured on the benchmark VM at 1,000 streams × 256 connections with one
//! group, snapshots of 20–25 MB and 8 MiB cold objects written flat out each held every
//! connection for 10–40 ms. Written in pieces of [`Pace::BACKGROUND`]'s 64 KiB, each written
//! back before the next, with a pause after each, a WAL sync waits for at most one piece, and
//! the disk is the WAL's between pieces (the same pacing as the WAL's own segment fill,
//! `wal/prepare.rs`). Pieces of 256 KiB at 64 MiB/s held the WAL sync each of them met: at 1
//! stream × 16 connections, with a flush of the local cold tier every second, 3,500–4,100
//! appends in 5 s took over 0.7 ms; 64 KiB pieces at 16 MiB/s, 2,700–3,300, and p99 fell from
//! 0.79–0.88 to 0.75–0.81 ms, with no change at 100 × 32, 1,000 × 256 or 10,000 × 256
//! (docs/benchmarks.md, session 28).
//!
//! A piece is written back with `sync_file_range` ([`crate::fs::FsFile::write_back`]), not
//! synced: the pages reach the device, but without a device cache flush per piece (about 5 %
//! of the device's flushes at 1 × 16). The one sync at the end makes the whole file durable.
//! The append p99 did not move measurably (docs/benchmarks.md, session 32).
//!
//! The pace is a rate with a bound on the time: a large write goes faster than the rate so
//! that it never takes longer than [`Pace::longest`] (a snapshot holds the log it replaces,
//! and a shutdown waits for it).

use std::io;
use std::thread;
use std::time::{Duration, Instant};

/// How a background write spreads its bytes over time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pace {
    /// Bytes written between write-backs.
    pub piece: usize,
    /// Bytes per second; 0 writes without pauses.
    pub rate: u64,
    /// The longest a paced write takes (it goes faster than `rate` to keep within it).
    pub longest: Duration,
}

impl Pace {
    /// Snapshots and local cold objects written beside a live WAL: 64 KiB pieces at
    /// 16 MiB/s, done within two seconds.
    pub const BACKGROUND: Pace = Pace {
        piece: 64 << 10,
        rate: 16 << 20,
        longest: Duration::from_secs(2),
    };

    /// No pauses, a write-back every 2 MiB: for a write something waits on (a follower installing a
    /// snapshot, a flush that must make room, a create a request asked for).
    pub const FLAT: Pace = Pace {
        piece: 2 << 20,
        rate: 0,
        longest: Duration::ZERO,
    };

    /// The pause after a piece of `n` bytes that took `took`, in a write of `total` bytes.
    pub fn pause(&self, n: usize, total: u64, took: Duration) -> Duration {
        if self.rate == 0 {
            return Duration::ZERO;
        }
        let floor = if self.longest.is_zero() {
            0.0
        } else {
            total as f64 / self.longest.as_secs_f64()
        };
        let rate = (self.rate as f64).max(floor);
        Duration::from_secs_f64(n as f64 / rate).saturating_sub(took)
    }

    /// Writes `pieces` one after another from offset 0 through `write_at` (buffers, offset),
    /// calling `write_back` (offset, length) on every [`Pace::piece`] bytes but the last ones
    /// and pausing after each. Nothing here makes the bytes durable: the caller syncs the file
    /// before publishing it.
    ///
    /// Each piece of the file is handed to `write_at` whole, as the parts of `pieces` it
    /// holds, for one vectored write: the page cache gives a write folios as large as the
    /// write and as aligned as its offset, so a piece written in one call at a multiple of
    /// its size lies in few large folios, where its parts written one by one (a header, then
    /// slices of appends) left runs of 4 KiB pages. Every later `sendfile` from the file looks
    /// its folios up one by one (docs/benchmarks.md, session 34).
    pub fn write<'a>(
        &self,
        pieces: impl IntoIterator<Item = &'a [u8]> + Clone,
        mut write_at: impl FnMut(&[&[u8]], u64) -> io::Result<()>,
        mut write_back: impl FnMut(u64, u64) -> io::Result<()>,
    ) -> io::Result<()> {
        let piece = self.piece.max(1);
        let total: u64 = pieces.clone().into_iter().map(|p| p.len() as u64).sum();
        let mut written = 0u64;
        let mut window: Vec<&[u8]> = Vec::new();
        let mut in_window = 0usize;
        let mut started = Instant::now();
        for p in pieces {
            let mut rest = p;
            while !rest.is_empty() {
                let n = rest.len().min(piece - in_window);
                window.push(&rest[..n]);
                rest = &rest[n..];
                in_window += n;
                if in_window == piece {
                    write_at(&window, written)?;
                    written += in_window as u64;
                    window.clear();
                    in_window = 0;
                    if written < total {
                        write_back(written - piece as u64, piece as u64)?;
                        thread::sleep(self.pause(piece, total, started.elapsed()));
                        started = Instant::now();
                    }
                }
            }
        }
        if in_window > 0 {
            write_at(&window, written)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_small_write_keeps_the_rate_and_a_large_one_the_time_bound() {
        let p = Pace::BACKGROUND;
        // 64 KiB at 16 MiB/s: about 3.9 ms, less the time the piece took.
        let pause = p.pause(64 << 10, 8 * MIB, Duration::ZERO);
        assert_eq!(pause.as_micros(), 3_906);
        assert_eq!(
            p.pause(64 << 10, 8 * MIB, Duration::from_millis(1))
                .as_micros(),
            2_906
        );
        // 1 GiB in two seconds: 512 MiB/s, so about 0.12 ms per piece.
        assert_eq!(
            p.pause(64 << 10, 1024 * MIB, Duration::ZERO).as_micros(),
            122
        );
        // A piece slower than its share is not followed by a pause.
        assert!(p.pause(64 << 10, MIB, Duration::from_millis(9)).is_zero());
        assert!(Pace::FLAT.pause(2 << 20, MIB, Duration::ZERO).is_zero());
    }

    #[test]
    fn every_byte_is_written_in_order_with_a_write_back_of_each_piece_but_the_last() {
        let pace = Pace {
            piece: 4,
            rate: 0,
            longest: Duration::ZERO,
        };
        let mut out = Vec::new();
        let mut marks = Vec::new();
        let mut writes = Vec::new();
        let pieces: [&[u8]; 3] = [b"abcdef", b"gh", b"ijklm"];
        // Each write-back covers the piece just written; none follows the last piece (the
        // caller's sync makes the whole file durable).
        let out_len = std::cell::Cell::new(0);
        pace.write(
            pieces,
            |bufs, at| {
                assert_eq!(at, out.len() as u64);
                for b in bufs {
                    out.extend_from_slice(b);
                }
                writes.push(bufs.len());
                out_len.set(out.len());
                Ok(())
            },
            |at, len| {
                assert_eq!(at + len, out_len.get() as u64);
                marks.push((at, len));
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(out, b"abcdefghijklm");
        assert_eq!(marks, vec![(0, 4), (4, 4), (8, 4)]);
        // One write per piece, of the parts of `pieces` it holds: "abcd", "ef" + "gh",
        // "ijkl", "m".
        assert_eq!(writes, vec![1, 2, 1, 1]);
    }

    #[test]
    fn a_failed_write_back_stops_the_write() {
        let mut writes = 0;
        let err = Pace::FLAT
            .write(
                [&[0u8; 5 << 20][..]],
                |_, _| {
                    writes += 1;
                    Ok(())
                },
                |_, _| Err(io::Error::other("write-back failed")),
            )
            .unwrap_err();
        assert_eq!(err.to_string(), "write-back failed");
        assert_eq!(writes, 1);
    }
}
