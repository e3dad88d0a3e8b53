//! `fl privacy`: planning a private run with the accountant the server uses.

use anyhow::{Context, bail};
use fl_common::privacy::{
    AccountantKind, Budget, GaussianRound, PrivacyEvent, Sampling, after_rounds, max_rounds,
    min_sigma,
};
use serde_json::json;

/// The question asked.
#[derive(Debug, clap::Subcommand)]
pub enum Question {
    /// Epsilon after --rounds rounds at --delta.
    Epsilon(Args),
    /// Delta after --rounds rounds at fixed --eps (the Geyer et al. view).
    Delta(Args),
    /// The smallest sigma that keeps --rounds rounds within --eps at --delta.
    Sigma(Args),
    /// How many rounds --sigma allows within --eps at --delta.
    Rounds(Args),
    /// Recompute what a run spent from its ledger.jsonl alone (at --delta, or at fixed --eps).
    Ledger {
        /// The run's ledger.jsonl.
        file: std::path::PathBuf,
        /// State epsilon at this delta.
        #[arg(long, conflicts_with = "eps")]
        delta: Option<f64>,
        /// State delta at this epsilon.
        #[arg(long)]
        eps: Option<f64>,
        /// pld or rdp (default: the one the ledger names).
        #[arg(long)]
        accountant: Option<AccountantKind>,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
}

/// Inputs shared by every question.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Sampling rate q (or give --m and --k).
    #[arg(long)]
    q: Option<f64>,
    /// Clients per round m (with --k).
    #[arg(long)]
    m: Option<f64>,
    /// Clients K (with --m).
    #[arg(long)]
    k: Option<f64>,
    /// Noise multiplier sigma.
    #[arg(long)]
    sigma: Option<f64>,
    /// Rounds T.
    #[arg(long)]
    rounds: Option<u64>,
    /// Target delta.
    #[arg(long)]
    delta: Option<f64>,
    /// Target epsilon.
    #[arg(long)]
    eps: Option<f64>,
    /// poisson or fixed.
    #[arg(long, default_value = "poisson", value_parser = parse_sampling)]
    sampling: Sampling,
    /// pld (tighter; Poisson sampling only) or rdp (default: pld for Poisson sampling).
    #[arg(long)]
    accountant: Option<AccountantKind>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

fn parse_sampling(s: &str) -> Result<Sampling, String> {
    match s {
        "poisson" => Ok(Sampling::Poisson),
        "fixed" => Ok(Sampling::Fixed),
        _ => Err(format!("unknown sampling `{s}` (poisson or fixed)")),
    }
}

impl Args {
    fn q(&self) -> anyhow::Result<f64> {
        match (self.q, self.m, self.k) {
            (Some(q), None, None) => Ok(q),
            (None, Some(m), Some(k)) if k > 0.0 => Ok(m / k),
            _ => bail!("give --q, or --m and --k"),
        }
    }

    /// The accountant asked for, or PLD for Poisson sampling and RDP otherwise; PLD does not
    /// account fixed-size sampling.
    fn accountant(&self) -> anyhow::Result<AccountantKind> {
        match (self.accountant, self.sampling) {
            (Some(AccountantKind::Pld), Sampling::Fixed) => {
                bail!("--accountant pld accounts Poisson sampling only: use rdp with fixed")
            }
            (Some(kind), _) => Ok(kind),
            (None, Sampling::Poisson) => Ok(AccountantKind::Pld),
            (None, Sampling::Fixed) => Ok(AccountantKind::Rdp),
        }
    }

    fn need<T: Copy>(value: Option<T>, flag: &str) -> anyhow::Result<T> {
        value.with_context(|| format!("this question needs {flag}"))
    }
}

/// Prints `out` as JSON or as `key = value` pairs.
fn print(out: &serde_json::Value, as_json: bool) {
    if as_json {
        println!("{out}");
    } else {
        let obj = out.as_object().expect("built as an object");
        let parts: Vec<String> = obj.iter().map(|(k, v)| format!("{k} = {v}")).collect();
        println!("{}", parts.join(", "));
    }
}

/// Answers the question; prints text or JSON.
pub fn run(question: Question) -> anyhow::Result<()> {
    let (args, answer) = match question {
        Question::Ledger {
            file,
            delta,
            eps,
            accountant,
            json,
        } => {
            let budget = match (delta, eps) {
                (Some(delta), None) => Budget::Epsilon {
                    epsilon: f64::INFINITY,
                    delta,
                },
                (None, Some(epsilon)) => Budget::Delta {
                    epsilon,
                    delta: 1.0,
                },
                _ => bail!("give --delta (for epsilon) or --eps (for delta)"),
            };
            let entries = fl_server::ledger::read(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            let named = entries.first().map(|e| e.accountant.parse()).transpose();
            let kind = match accountant {
                Some(kind) => kind,
                None => named
                    .map_err(anyhow::Error::msg)?
                    .unwrap_or(AccountantKind::Rdp),
            };
            if let Some(e) = entries.iter().find(|e| !kind.supports(&e.event)) {
                bail!(
                    "round {}: the {kind} accountant cannot account this event",
                    e.round
                );
            }
            let ((epsilon, delta), rounds) = fl_server::ledger::replay(&file, &budget, kind)?;
            let out = json!({"epsilon": epsilon, "delta": delta, "rounds": rounds,
                             "accountant": kind.to_string(), "ledger": file});
            print(&out, json);
            return Ok(());
        }
        Question::Epsilon(a) => {
            let event: PrivacyEvent =
                GaussianRound::new(a.q()?, Args::need(a.sigma, "--sigma")?, a.sampling)?.into();
            let delta = Args::need(a.delta, "--delta")?;
            fl_common::privacy::check_delta(delta)?;
            let acc = after_rounds(a.accountant()?, &event, Args::need(a.rounds, "--rounds")?);
            let eps = acc.epsilon(delta);
            (a, json!({"epsilon": eps, "delta": delta}))
        }
        Question::Delta(a) => {
            let event: PrivacyEvent =
                GaussianRound::new(a.q()?, Args::need(a.sigma, "--sigma")?, a.sampling)?.into();
            let eps = Args::need(a.eps, "--eps")?;
            fl_common::privacy::check_epsilon(eps)?;
            let acc = after_rounds(a.accountant()?, &event, Args::need(a.rounds, "--rounds")?);
            (a, json!({"epsilon": eps, "delta": acc.delta(eps)}))
        }
        Question::Sigma(a) => {
            let budget = Budget::Epsilon {
                epsilon: Args::need(a.eps, "--eps")?,
                delta: Args::need(a.delta, "--delta")?,
            };
            let rounds = Args::need(a.rounds, "--rounds")?;
            let sigma = min_sigma(a.accountant()?, a.q()?, rounds, &budget, a.sampling)?;
            let acc = after_rounds(
                a.accountant()?,
                &GaussianRound::new(a.q()?, sigma, a.sampling)?.into(),
                rounds,
            );
            let delta = Args::need(a.delta, "--delta")?;
            (
                a,
                json!({"sigma": sigma, "epsilon": acc.epsilon(delta), "delta": delta}),
            )
        }
        Question::Rounds(a) => {
            let budget = Budget::Epsilon {
                epsilon: Args::need(a.eps, "--eps")?,
                delta: Args::need(a.delta, "--delta")?,
            };
            let event: PrivacyEvent =
                GaussianRound::new(a.q()?, Args::need(a.sigma, "--sigma")?, a.sampling)?.into();
            let rounds = max_rounds(a.accountant()?, &event, &budget, 10_000_000)?;
            let acc = after_rounds(a.accountant()?, &event, rounds);
            let delta = Args::need(a.delta, "--delta")?;
            (
                a,
                json!({"rounds": rounds, "epsilon": acc.epsilon(delta), "delta": delta}),
            )
        }
    };
    let mut out = answer;
    out["accountant"] = json!(args.accountant()?.to_string());
    out["sampling"] = json!(args.sampling.to_string());
    out["q"] = json!(args.q()?);
    for (key, value) in [("sigma", args.sigma), ("m", args.m), ("k", args.k)] {
        if let Some(v) = value
            && out.get(key).is_none()
        {
            out[key] = json!(v);
        }
    }
    if let Some(r) = args.rounds
        && out.get("rounds").is_none()
    {
        out["rounds"] = json!(r);
    }
    print(&out, args.json);
    Ok(())
}
