//! Prints the fidelity table: the report's figures against the emulator's modeled ones.
//!
//! `cargo run --release -p exanet-proto --example fidelity [-- --short]`

fn main() {
    let short = std::env::args().any(|a| a == "--short");
    let rows = exanet_proto::fidelity::run(exanet_proto::model::Model::default(), short);
    print!("{}", exanet_proto::fidelity::table(&rows));
}
