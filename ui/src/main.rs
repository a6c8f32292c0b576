//! `sturdy-ui --dsn DSN [--listen ADDR:PORT] [--token TOKEN] [--allow-actions]
//! [--sample-every SECONDS]`: see the crate's documentation (`lib.rs`).

#[tokio::main]
async fn main() {
    let config = match sturdy_ui::Config::from_args(std::env::args().skip(1)) {
        Ok(config) => config,
        Err(why) => {
            eprintln!("sturdy-ui: {why}\n\n{}", sturdy_ui::USAGE);
            std::process::exit(2);
        }
    };
    if let Err(why) = sturdy_ui::serve(config).await {
        eprintln!("sturdy-ui: {why}");
        std::process::exit(1);
    }
}
