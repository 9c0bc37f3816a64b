//! Per-item pre-validation of batch calls: items rejected by the binding get
//! their code directly, the rest are sent to the client as a sub-batch, and
//! the answers are scattered back into the caller's order.

use mooncake_common::ErrorCode;

/// Which items of a batch are sent to the client.
pub struct Plan {
    /// Per item: `Some(code)` if rejected before the client call.
    pre: Vec<Option<i64>>,
    /// Indices of the items sent, in order.
    sent: Vec<usize>,
}

impl Plan {
    /// Build from per-item pre-validation results.
    pub fn new(pre: Vec<Option<i64>>) -> Self {
        let sent = pre
            .iter()
            .enumerate()
            .filter_map(|(i, p)| p.is_none().then_some(i))
            .collect();
        Plan { pre, sent }
    }

    /// Reject empty keys with INVALID_PARAMS.
    pub fn reject_empty_keys(keys: &[String]) -> Self {
        let invalid = ErrorCode::InvalidParams.code() as i64;
        Self::new(
            keys.iter()
                .map(|k| k.is_empty().then_some(invalid))
                .collect(),
        )
    }

    /// The items to send, in order.
    pub fn pick<T: Clone>(&self, items: &[T]) -> Vec<T> {
        self.sent.iter().map(|&i| items[i].clone()).collect()
    }

    /// Scatter the client's answers back; rejected items become
    /// `rejected(code)`, and answers the client did not give (a shorter
    /// result than requested) become `rejected(INTERNAL_ERROR)`.
    pub fn merge<R>(&self, results: Vec<R>, rejected: impl Fn(i64) -> R) -> Vec<R> {
        let mut answers = results.into_iter();
        self.pre
            .iter()
            .map(|pre| match pre {
                Some(code) => rejected(*code),
                None => answers
                    .next()
                    .unwrap_or_else(|| rejected(ErrorCode::InternalError.code() as i64)),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_keeps_order() {
        let keys: Vec<String> = ["a", "", "c"].iter().map(|s| s.to_string()).collect();
        let plan = Plan::reject_empty_keys(&keys);
        assert_eq!(plan.pick(&keys), vec!["a".to_string(), "c".to_string()]);
        assert_eq!(plan.merge(vec![1, 3], |c| c), vec![1, -600, 3]);
        assert_eq!(plan.merge(vec![1], |c| c), vec![1, -600, -1]);
    }
}
