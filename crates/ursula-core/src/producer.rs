//! Idempotent producers: epochs, sequences and retained receipts (protocol.md §6).

use crate::command::ProducerHdr;
use crate::error::{ErrorCode, Rejection};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// Receipts kept per producer and epoch; older duplicates answer 409 (OQ-18).
pub const RECEIPT_WINDOW: usize = 4096;

/// What one accepted request produced, replayed to a duplicate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    pub seq: u64,
    pub next_offset: u64,
    pub record_start: u64,
    pub record_next: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerState {
    pub epoch: u64,
    pub last_seq: u64,
    pub receipts: VecDeque<Receipt>,
}

/// The outcome of checking a producer tuple against the stored state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// A retry of an accepted request: answer with its receipt.
    Duplicate {
        receipt: Receipt,
        epoch: u64,
        last_seq: u64,
    },
    /// A new request that may proceed.
    Accept,
}

/// Finds a duplicate (step 9 of protocol.md §5.2); runs before the closed check.
pub fn find_duplicate(state: Option<&ProducerState>, p: &ProducerHdr) -> Option<Check> {
    let s = state?;
    if p.epoch != s.epoch || p.seq > s.last_seq {
        return None;
    }
    s.receipts
        .iter()
        .find(|r| r.seq == p.seq)
        .map(|r| Check::Duplicate {
            receipt: *r,
            epoch: s.epoch,
            last_seq: s.last_seq,
        })
}

/// Validates epoch and sequence (step 11); duplicates were handled before.
pub fn validate(state: Option<&ProducerState>, p: &ProducerHdr) -> Result<(), Rejection> {
    let seq_conflict = |expected: u64| {
        Rejection::new(
            ErrorCode::PRODUCER_SEQ_CONFLICT,
            format!(
                "producer sequence {} does not follow; expected {expected}",
                p.seq
            ),
        )
        .with(|f| {
            f.expected_seq = Some(expected);
            f.received_seq = Some(p.seq);
        })
    };
    match state {
        None if p.seq == 0 => Ok(()),
        None => Err(seq_conflict(0)),
        Some(s) if p.epoch < s.epoch => Err(Rejection::new(
            ErrorCode::PRODUCER_EPOCH_STALE,
            format!(
                "producer epoch {} is older than the current epoch {}",
                p.epoch, s.epoch
            ),
        )
        .with(|f| f.producer_epoch = Some(s.epoch))),
        Some(s) if p.epoch > s.epoch => {
            if p.seq == 0 {
                Ok(())
            } else {
                Err(Rejection::new(
                    ErrorCode::INVALID_PRODUCER,
                    "a new producer epoch must start at sequence 0",
                ))
            }
        }
        Some(s) if p.seq == s.last_seq + 1 => Ok(()),
        Some(s) => Err(seq_conflict(s.last_seq + 1)),
    }
}

/// Records an accepted request (only after it committed).
pub fn record(state: &mut Option<ProducerState>, p: &ProducerHdr, receipt: Receipt) {
    match state {
        Some(s) if s.epoch == p.epoch => {
            s.last_seq = p.seq;
            if s.receipts.len() >= RECEIPT_WINDOW {
                s.receipts.pop_front();
            }
            s.receipts.push_back(receipt);
        }
        _ => {
            let mut receipts = VecDeque::with_capacity(1);
            receipts.push_back(receipt);
            *state = Some(ProducerState {
                epoch: p.epoch,
                last_seq: p.seq,
                receipts,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hdr(epoch: u64, seq: u64) -> ProducerHdr {
        ProducerHdr {
            id: "p".into(),
            epoch,
            seq,
        }
    }

    fn rc(seq: u64) -> Receipt {
        Receipt {
            seq,
            next_offset: seq * 10,
            record_start: 0,
            record_next: 0,
        }
    }

    #[test]
    fn sequence_rules() {
        let mut s = None;
        assert!(validate(s.as_ref(), &hdr(0, 1)).is_err());
        assert!(validate(s.as_ref(), &hdr(0, 0)).is_ok());
        record(&mut s, &hdr(0, 0), rc(0));
        assert!(matches!(
            find_duplicate(s.as_ref(), &hdr(0, 0)),
            Some(Check::Duplicate { .. })
        ));
        assert!(validate(s.as_ref(), &hdr(0, 1)).is_ok());
        let gap = validate(s.as_ref(), &hdr(0, 3)).expect_err("gap");
        assert_eq!(gap.code, ErrorCode::PRODUCER_SEQ_CONFLICT);
        assert_eq!(gap.facts.expected_seq, Some(1));
        record(&mut s, &hdr(1, 0), rc(0));
        let stale = validate(s.as_ref(), &hdr(0, 5)).expect_err("stale");
        assert_eq!(stale.code, ErrorCode::PRODUCER_EPOCH_STALE);
        assert_eq!(
            validate(s.as_ref(), &hdr(2, 1)).map_err(|r| r.code),
            Err(ErrorCode::INVALID_PRODUCER)
        );
    }
}
