//! The command line on real files.

use std::process::Command;

fn run(lines: &[&str], extra: &[&str]) -> (i32, String) {
    let dir = std::env::temp_dir().join(format!("lincheck-{}-{}", std::process::id(), lines.len()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let path = dir.join("h.jsonl");
    std::fs::write(&path, lines.join("\n")).expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_mooncake-lincheck"))
        .args(extra)
        .arg(&path)
        .output()
        .expect("run");
    let _ = std::fs::remove_dir_all(&dir);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

const WRITE: &str =
    r#"{"client":0,"key":"k","call":{"upsert":7},"invoke":0,"complete":5,"outcome":{"ok":null}}"#;
const READ_NEW: &str =
    r#"{"client":1,"key":"k","call":"get","invoke":6,"complete":9,"outcome":{"ok":7}}"#;
const READ_NONE: &str =
    r#"{"client":1,"key":"k","call":"get","invoke":6,"complete":9,"outcome":{"ok":null}}"#;

#[test]
fn a_good_history_exits_0_and_a_bad_one_1() {
    let (code, out) = run(&[WRITE, READ_NEW], &[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("checked: 2 ops, 1 keys, 0 anomalies"), "{out}");
    let (code, out) = run(&[WRITE, READ_NONE], &[]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("NotLinearizable"), "{out}");
    // Eviction explains a read that finds nothing.
    assert_eq!(run(&[WRITE, READ_NONE], &["--eviction"]).0, 0);
}

#[test]
fn bad_input_exits_2() {
    assert_eq!(run(&["{not json"], &[]).0, 2);
    assert_eq!(run(&[WRITE], &["--stuck-after"]).0, 2);
}
