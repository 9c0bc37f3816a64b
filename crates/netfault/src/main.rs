//! `mc_nfq_delay`: hold every packet of one NFQUEUE queue for a fixed time,
//! then accept it. The multi-host tests (tests/cluster) add latency with
//! `tc qdisc ... netem delay` when the kernel has `sch_netem`; where it has
//! not, they send a namespace's outgoing packets to an NFQUEUE
//! (`iptables -j NFQUEUE --queue-bypass`) and run this program in that
//! namespace to serve the queue.
//!
//! ```text
//! mc_nfq_delay --queue 7 --delay-ms 10
//! ```
//!
//! Packets leave in arrival order, each `delay` after it arrived, so the
//! delay adds latency without reordering or throttling. The queue is opened
//! fail-open: when the kernel queue is full, packets pass undelayed instead
//! of being dropped. The program prints `ready` on stdout once it is bound,
//! and exits on SIGTERM/SIGINT (the kernel then drops what it still holds,
//! and `--queue-bypass` lets later packets through).

use std::collections::VecDeque;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nfq::{Queue, Verdict};

/// Set by the signal handler; the main loop exits when it is set.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_sig: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Parsed command line.
struct Args {
    queue: u16,
    delay: Duration,
}

fn parse_args() -> Result<Args, String> {
    let mut queue = None;
    let mut delay_ms = None;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let (name, inline) = match a.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None => (a.clone(), None),
        };
        let mut value = || inline.clone().or_else(|| it.next());
        match name.as_str() {
            "--queue" => {
                let v = value().ok_or("--queue needs a value")?;
                queue = Some(v.parse::<u16>().map_err(|e| format!("--queue {v}: {e}"))?);
            }
            "--delay-ms" => {
                let v = value().ok_or("--delay-ms needs a value")?;
                delay_ms = Some(
                    v.parse::<u64>()
                        .map_err(|e| format!("--delay-ms {v}: {e}"))?,
                );
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(Args {
        queue: queue.ok_or("--queue is required")?,
        delay: Duration::from_millis(delay_ms.ok_or("--delay-ms is required")?),
    })
}

fn install_signal_handlers() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: `on_signal` only stores to an atomic, which is
        // async-signal-safe; the handler stays valid for the whole process.
        unsafe {
            libc::signal(
                sig,
                on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t,
            );
        }
    }
}

fn run(args: &Args) -> std::io::Result<()> {
    let mut q = Queue::open()?;
    q.bind(args.queue)?;
    q.set_fail_open(args.queue, true)?;
    q.set_recv_gso(args.queue, true)?;
    q.set_queue_max_len(args.queue, 16384)?;
    // Metadata only: the verdict needs the packet id, not the bytes.
    q.set_copy_range(args.queue, 0)?;
    q.set_nonblocking(true);
    println!("ready");
    std::io::stdout().flush()?;

    let mut held: VecDeque<(Instant, nfq::Message)> = VecDeque::new();
    let poll = Duration::from_micros(200);
    while !STOP.load(Ordering::SeqCst) {
        loop {
            match q.recv() {
                Ok(msg) => held.push_back((Instant::now() + args.delay, msg)),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => break,
                Err(e) => return Err(e),
            }
        }
        let now = Instant::now();
        while held.front().is_some_and(|(due, _)| *due <= now) {
            if let Some((_, mut msg)) = held.pop_front() {
                msg.set_verdict(Verdict::Accept);
                q.verdict(msg)?;
            }
        }
        let wait = held
            .front()
            .map(|(due, _)| due.saturating_duration_since(now).min(poll))
            .unwrap_or(poll);
        std::thread::sleep(wait);
    }
    // Let what we hold go rather than have the kernel drop it on unbind.
    for (_, mut msg) in held.drain(..) {
        msg.set_verdict(Verdict::Accept);
        q.verdict(msg)?;
    }
    Ok(())
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("mc_nfq_delay: {e}\nusage: mc_nfq_delay --queue N --delay-ms MS");
            std::process::exit(2);
        }
    };
    install_signal_handlers();
    if let Err(e) = run(&args) {
        eprintln!("mc_nfq_delay: {e}");
        std::process::exit(1);
    }
}
