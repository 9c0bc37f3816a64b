//! `mooncake_master` entry point; everything lives in [`mooncake_master::server`].

fn main() {
    std::process::exit(mooncake_master::server::run_master(
        std::env::args().collect(),
    ))
}
