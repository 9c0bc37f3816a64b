//! Row ids of a lookup: a `[B, L, H]` block of int64, and the rules for
//! ids given as nested sequences, checked as the ids arrive: every
//! innermost row holds one id per head (H), every batch row holds the same
//! number of rows (L), and there is at least one of each.

use crate::config::empty_ids;
use crate::error::{Error, Result};
use mooncake_client::ErrorCode;

/// Row ids as a flat `[b, l, H]` int64 block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ids {
    /// The ids, batch row by batch row, row by row.
    pub data: Vec<i64>,
    /// Batch rows (B).
    pub b: usize,
    /// Rows per batch row (L).
    pub l: usize,
}

/// Builds [`Ids`] from a nested sequence: the caller walks it and reports
/// each batch row ([`IdsBuilder::begin_batch`], [`IdsBuilder::end_batch`]),
/// each row in it ([`IdsBuilder::begin_row`], [`IdsBuilder::end_row`]) and
/// each id ([`IdsBuilder::push`]); a shape rule broken fails at once with
/// the place it was broken.
#[derive(Debug)]
pub struct IdsBuilder {
    heads: usize,
    data: Vec<i64>,
    b: usize,
    l: Option<usize>,
    rows: usize,
    row_start: usize,
}

fn ragged(why: String) -> Error {
    Error::lookup(ErrorCode::InvalidParams, why)
}

impl IdsBuilder {
    /// A builder for `heads` ids per row, expecting about `batch_rows`.
    pub fn new(heads: usize, batch_rows: usize) -> Self {
        IdsBuilder {
            heads,
            data: Vec::with_capacity(batch_rows.saturating_mul(heads)),
            b: 0,
            l: None,
            rows: 0,
            row_start: 0,
        }
    }

    /// The next batch row starts.
    pub fn begin_batch(&mut self) {
        self.rows = 0;
    }

    /// The next row of the current batch row starts.
    pub fn begin_row(&mut self) {
        self.row_start = self.data.len();
    }

    /// One id of the current row.
    pub fn push(&mut self, id: i64) {
        self.data.push(id);
    }

    /// The current row ended: it must hold one id per head.
    pub fn end_row(&mut self) -> Result<()> {
        let n = self.data.len() - self.row_start;
        if n != self.heads {
            return Err(ragged(format!(
                "ragged row_ids: row_ids[{}][{}] has {n} ids, not H={}",
                self.b, self.rows, self.heads
            )));
        }
        self.rows += 1;
        Ok(())
    }

    /// The current batch row ended: it must hold rows, as many as the first.
    pub fn end_batch(&mut self) -> Result<()> {
        match self.l {
            None if self.rows == 0 => return Err(empty_ids()),
            None => self.l = Some(self.rows),
            Some(l) if l != self.rows => {
                return Err(ragged(format!(
                    "ragged row_ids: row_ids[{}] has {} rows, not L={l}",
                    self.b, self.rows
                )));
            }
            Some(_) => {}
        }
        self.b += 1;
        Ok(())
    }

    /// The error for an element that should have been a sequence: a batch
    /// row, or (`in_row`) a row of the current batch row.
    pub fn not_a_sequence(&self, in_row: bool) -> Error {
        if in_row {
            ragged(format!(
                "row_ids[{}][{}] is not a sequence",
                self.b, self.rows
            ))
        } else {
            ragged(format!("row_ids[{}] is not a sequence", self.b))
        }
    }

    /// All batch rows were given: at least one.
    pub fn finish(self) -> Result<Ids> {
        match self.l {
            Some(l) if self.b > 0 => Ok(Ids {
                data: self.data,
                b: self.b,
                l,
            }),
            _ => Err(empty_ids()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(rows: &[&[&[i64]]], heads: usize) -> Result<Ids> {
        let mut ib = IdsBuilder::new(heads, rows.len());
        for batch in rows {
            ib.begin_batch();
            for row in *batch {
                ib.begin_row();
                for &id in *row {
                    ib.push(id);
                }
                ib.end_row()?;
            }
            ib.end_batch()?;
        }
        ib.finish()
    }

    #[test]
    fn a_well_formed_block_is_flattened_batch_by_batch() {
        let ids = build(&[&[&[1, 2], &[3, 4]], &[&[5, 6], &[7, 8]]], 2).unwrap();
        assert_eq!(ids.data, vec![1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!((ids.b, ids.l), (2, 2));
    }

    #[test]
    fn ragged_and_empty_ids_fail_with_where() {
        let e = build(&[&[&[1, 2], &[3]]], 2).unwrap_err();
        assert!(
            e.to_string().contains("row_ids[0][1] has 1 ids, not H=2"),
            "{e}"
        );
        let e = build(&[&[&[1, 2]], &[&[3, 4], &[5, 6]]], 2).unwrap_err();
        assert!(
            e.to_string().contains("row_ids[1] has 2 rows, not L=1"),
            "{e}"
        );
        assert_eq!(build(&[], 2).unwrap_err(), empty_ids());
        assert_eq!(build(&[&[]], 2).unwrap_err(), empty_ids());
        let ib = IdsBuilder::new(2, 1);
        assert!(ib
            .not_a_sequence(false)
            .to_string()
            .contains("row_ids[0] is not a sequence"));
        assert_eq!(ib.not_a_sequence(true).code(), ErrorCode::InvalidParams);
    }
}
