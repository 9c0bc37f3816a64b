//! `mooncake_client` entry point; everything lives in [`mooncake_standalone::run_client`].

fn main() {
    std::process::exit(mooncake_standalone::run_client(std::env::args().collect()))
}
