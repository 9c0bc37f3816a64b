//! `transfer_engine_bench` entry point; everything lives in [`mooncake_bench`].

fn main() {
    std::process::exit(mooncake_bench::run_transfer_engine_bench(
        std::env::args().collect(),
    ))
}
