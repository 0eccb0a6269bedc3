//! The `ktlsd` executable: the server is the library (`src/lib.rs`).

fn main() -> std::process::ExitCode {
    ktlsd::main()
}
