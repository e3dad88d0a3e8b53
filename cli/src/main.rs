//! `fl`: the command-line tool of the federated-learning system.

mod authority;
mod enroll;
mod plot;
mod privacy;
mod sim;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// Federated learning with privacy built in.
#[derive(Debug, Parser)]
#[command(name = "fl", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the server and K clients in one process (the clients call the server's gRPC service
    /// in-process, without a network).
    Sim(sim::SimArgs),
    /// Plan a private run: epsilon, delta, sigma or rounds (the server's accountants: PLD for
    /// Poisson sampling and DP-FTRL by default, RDP otherwise); check a run's ledger.
    #[command(subcommand)]
    Privacy(privacy::Question),
    /// Redraw accuracy.svg (and privacy.svg) of a run folder from its metrics.jsonl.
    Plot {
        /// The run folder.
        run: PathBuf,
    },
    /// Enroll a client in the server's enrollment file: prints its new token (once; the file
    /// keeps only its digest), or records its client certificate's fingerprint.
    Enroll(enroll::EnrollArgs),
    /// Revoke an enrolled client: a running server ends its session within a second and refuses
    /// it from then on.
    Revoke(enroll::RevokeArgs),
    /// The federation authority, a key the server does not hold: its key pair, clients' identity
    /// keys, certificates binding a name to an identity key, and revocations.
    #[command(subcommand)]
    Authority(authority::AuthorityCommand),
    /// Draw a sweep's table (scripts/epsilon-sweep.sh): final test accuracy against epsilon, a
    /// line per label.
    SweepPlot {
        /// The tab-separated table (runs/sweep/results.tsv).
        table: PathBuf,
        /// Chart title.
        #[arg(long, default_value = "")]
        title: String,
        /// The SVG to write.
        #[arg(long)]
        out: PathBuf,
    },
    /// Draw the test accuracy of several runs on one chart.
    Compare {
        /// Runs as LABEL=RUN_FOLDER.
        #[arg(required = true, value_parser = parse_labelled)]
        runs: Vec<(String, PathBuf)>,
        /// The x axis.
        #[arg(long, value_enum, default_value_t = plot::XAxis::Round)]
        x: plot::XAxis,
        /// Chart title.
        #[arg(long, default_value = "")]
        title: String,
        /// The SVG to write.
        #[arg(long)]
        out: PathBuf,
    },
}

/// Parses `LABEL=PATH`.
fn parse_labelled(s: &str) -> Result<(String, PathBuf), String> {
    let (label, path) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}`: expected LABEL=RUN_FOLDER"))?;
    Ok((label.to_string(), PathBuf::from(path)))
}

fn main() -> ExitCode {
    // Before the runtime starts its threads (fl_common::allocator).
    fl_common::allocator::tune();
    match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", fl_common::error_chain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

#[tokio::main]
async fn run() -> anyhow::Result<ExitCode> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // The operator endpoints' addresses (the live page's URL) and warnings.
                .unwrap_or_else(|_| "warn,fl_server::operator::endpoint=info".into()),
        )
        .with_writer(std::io::stderr)
        // Colours only on a terminal: logs collected by docker or a file stay plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match Cli::parse().command {
        Command::Sim(args) => {
            let ended = sim::run(args).await?;
            println!(
                "{}",
                serde_json::to_string_pretty(&summary_line(&ended.summary))?
            );
            if let Some(signal) = ended.signal {
                let dir = &ended.summary.config["server"]["out"];
                eprintln!(
                    "interrupted by {signal}; resume with: fl sim --resume {}",
                    dir.as_str().unwrap_or("RUN_DIR")
                );
                // 128 + the signal's number, as a shell reports a command a signal ended.
                return Ok(ExitCode::from(if signal == "SIGTERM" { 143 } else { 130 }));
            }
        }
        Command::Privacy(q) => privacy::run(q)?,
        Command::Enroll(args) => match enroll::enroll(&args)? {
            Some(token) => println!("{token}"),
            None => eprintln!("{} enrolled by its certificate", args.name),
        },
        Command::Revoke(args) => enroll::revoke(&args)?,
        Command::Authority(command) => println!("{}", authority::run(command)?),
        Command::Plot { run } => {
            for file in plot::plot_run(&run, &run.display().to_string())? {
                println!("wrote {}", file.display());
            }
        }
        Command::Compare {
            runs,
            x,
            title,
            out,
        } => {
            plot::compare_runs(&runs, x, &title, &out)?;
            println!("wrote {}", out.display());
        }
        Command::SweepPlot { table, title, out } => {
            plot::plot_sweep(&table, &title, &out)?;
            println!("wrote {}", out.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The headline figures of a run, for the terminal (the full summary is in summary.json).
fn summary_line(s: &fl_server::output::Summary) -> serde_json::Value {
    serde_json::json!({
        "rounds_completed": s.rounds_completed,
        "test_accuracy": s.test_accuracy,
        "test_loss": s.test_loss,
        "client_updates": s.client_updates,
        "bytes_up": s.bytes_up,
        "bytes_down": s.bytes_down,
        "wall_seconds": s.wall_seconds,
        "stopped_by": s.stopped_by,
        "epsilon": s.epsilon,
        "delta": s.delta,
        "run_folder": s.config["server"]["out"],
    })
}

#[cfg(test)]
mod tests {
    /// docs/src/reference/fl.md is what clap makes of the flags.
    #[test]
    fn the_command_line_reference_is_current() {
        let page = clap_markdown::help_markdown::<super::Cli>();
        let test = "cargo test -p fl-cli --bin fl the_command_line_reference_is_current";
        let page_file = "docs/src/reference/fl.md";
        fl_common::generated_docs::assert_fresh(env!("CARGO_MANIFEST_DIR"), page_file, &page, test);
    }
}
