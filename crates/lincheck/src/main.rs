//! `mooncake-lincheck [--eviction] [--stuck-after NS] HISTORY.jsonl`: checks
//! a recorded history (one JSON [`Op`] per line; times in ns of one clock)
//! and prints one line per anomaly, then `checked: N ops, K keys, A
//! anomalies`. Exits 1 when anything was found, 2 on bad input.

use mooncake_lincheck::{check, Model, Op};
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut model = Model::default();
    let mut stuck_after = u64::MAX;
    let mut path = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--eviction" => model.eviction = true,
            "--stuck-after" => match args.next().and_then(|v| v.parse().ok()) {
                Some(ns) => stuck_after = ns,
                None => {
                    eprintln!("--stuck-after needs a number of ns");
                    return ExitCode::from(2);
                }
            },
            _ if path.is_none() => path = Some(a),
            _ => {
                eprintln!("unexpected argument {a:?}");
                return ExitCode::from(2);
            }
        }
    }
    let Some(path) = path else {
        eprintln!("usage: mooncake-lincheck [--eviction] [--stuck-after NS] HISTORY.jsonl");
        return ExitCode::from(2);
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("cannot read {path}: {e}");
            return ExitCode::from(2);
        }
    };
    let mut history = Vec::new();
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        match serde_json::from_str::<Op>(line) {
            Ok(op) => history.push(op),
            Err(e) => {
                eprintln!("{path}:{}: {e}", n + 1);
                return ExitCode::from(2);
            }
        }
    }
    let end = history
        .iter()
        .map(|o| o.complete.unwrap_or(o.invoke))
        .max()
        .unwrap_or(0);
    let report = check(&history, model, end, stuck_after);
    for a in &report.anomalies {
        println!("{a:?}");
    }
    println!(
        "checked: {} ops, {} keys, {} anomalies",
        report.ops,
        report.keys,
        report.anomalies.len()
    );
    if report.anomalies.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
