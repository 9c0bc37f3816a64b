//! `mc_nfq_delay`: hold the packets of one NFQUEUE queue for a fixed time,
//! then accept them. The multi-host tests (tests/cluster) add latency with
//! `tc qdisc ... netem delay` when the kernel has `sch_netem`; where it has
//! not, they send a namespace's outgoing packets to an NFQUEUE
//! (`iptables -j NFQUEUE --queue-bypass`) and run this program in that
//! namespace to serve the queue.
//!
//! ```text
//! mc_nfq_delay --queue 7 --delay-ms 10
//! mc_nfq_delay --queue 7 --delay-ms 10 --hold-pct 25 --seed 3
//! ```
//!
//! By default every packet is held: packets leave in arrival order, each
//! `delay` after it arrived, so the delay adds latency without reordering or
//! throttling. With `--hold-pct P` only P % of the packets, drawn at random
//! (`--seed` makes the draw repeatable), are held and the rest pass at once,
//! so a held packet arrives after packets sent behind it: reordering. The queue is opened
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
    /// Share of the packets held, in percent (100: all of them).
    hold_pct: u32,
    seed: u64,
}

fn parse_args() -> Result<Args, String> {
    let mut queue = None;
    let mut delay_ms = None;
    let mut hold_pct = 100;
    let mut seed = None;
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
            "--hold-pct" => {
                let v = value().ok_or("--hold-pct needs a value")?;
                hold_pct = v
                    .parse::<u32>()
                    .ok()
                    .filter(|p| *p <= 100)
                    .ok_or(format!("--hold-pct {v}: a whole percentage 0-100"))?;
            }
            "--seed" => {
                let v = value().ok_or("--seed needs a value")?;
                seed = Some(v.parse::<u64>().map_err(|e| format!("--seed {v}: {e}"))?);
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(Args {
        queue: queue.ok_or("--queue is required")?,
        delay: Duration::from_millis(delay_ms.ok_or("--delay-ms is required")?),
        hold_pct,
        seed: seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        }),
    })
}

/// The draw of which packets are held: xorshift64*, enough for spreading
/// packets over two paths (not for anything that needs real randomness).
struct Draw(u64);

impl Draw {
    fn new(seed: u64) -> Self {
        // xorshift has one fixed point, zero.
        Draw(seed.max(1))
    }

    /// Whether the next packet is held, with probability `pct` %.
    fn hold(&mut self, pct: u32) -> bool {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let r = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d);
        (r >> 32) % 100 < u64::from(pct)
    }
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

    // Every held packet waits the same time, so the queue stays in due order.
    let mut held: VecDeque<(Instant, nfq::Message)> = VecDeque::new();
    let mut draw = Draw::new(args.seed);
    let poll = Duration::from_micros(200);
    while !STOP.load(Ordering::SeqCst) {
        loop {
            match q.recv() {
                Ok(mut msg) => {
                    if draw.hold(args.hold_pct) {
                        held.push_back((Instant::now() + args.delay, msg));
                    } else {
                        msg.set_verdict(Verdict::Accept);
                        q.verdict(msg)?;
                    }
                }
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
            eprintln!("mc_nfq_delay: {e}\nusage: mc_nfq_delay --queue N --delay-ms MS [--hold-pct P] [--seed S]");
            std::process::exit(2);
        }
    };
    install_signal_handlers();
    if let Err(e) = run(&args) {
        eprintln!("mc_nfq_delay: {e}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::Draw;

    #[test]
    fn the_draw_holds_about_the_share_asked_and_none_or_all_at_the_ends() {
        let mut d = Draw::new(7);
        let held = (0..100_000).filter(|_| d.hold(25)).count();
        assert!(
            (23_000..27_000).contains(&held),
            "{held} of 100000 held at 25 %"
        );
        assert!((0..1000).all(|_| !d.hold(0)));
        assert!((0..1000).all(|_| d.hold(100)));
    }

    #[test]
    fn the_same_seed_draws_the_same_packets() {
        let (mut a, mut b) = (Draw::new(11), Draw::new(11));
        let xs: Vec<bool> = (0..500).map(|_| a.hold(40)).collect();
        let ys: Vec<bool> = (0..500).map(|_| b.hold(40)).collect();
        assert_eq!(xs, ys);
        let mut zero = Draw::new(0);
        assert!((0..1000).any(|_| zero.hold(50)), "seed 0 must not stick");
    }
}
