//! `fl privacy`: planning a private run with the accountant the server uses.

use anyhow::{Context, bail};
use fl_privacy::{
    Accountant, AccountantKind, BandedRound, Budget, GaussianRound, Neighbours, PrivacyEvent,
    Sampling, UnsampledGaussian, after_rounds, max_rounds, min_sigma, tree_nodes,
    tree_rounds_within,
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
    /// Recompute what a run spent from its ledger.jsonl alone (at --delta, at fixed --eps, or
    /// without either in the run's own terms, its privacy.delta), or --verify its hash chain.
    Ledger(LedgerArgs),
}

/// `fl privacy ledger`'s arguments.
#[derive(Debug, clap::Args)]
pub struct LedgerArgs {
    /// The run's ledger.jsonl, or its run folder.
    file: std::path::PathBuf,
    /// Check the ledger's hash chain, and against the head the run folder's checkpoint
    /// recorded (lines cut from the end); prints the lines and the head.
    #[arg(long)]
    verify: bool,
    /// State epsilon at this delta (default: the run's privacy.delta, from its checkpoint).
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
}

impl LedgerArgs {
    /// Verifies the ledger, or recomputes what it spent; prints the answer.
    fn answer(self) -> anyhow::Result<()> {
        let file = ledger_file(self.file)?;
        if self.verify {
            return verify_ledger(&file, self.json);
        }
        let (budget, at) = match (self.delta, self.eps) {
            (Some(delta), None) => (stated_epsilon(delta), None),
            (None, Some(epsilon)) => (stated_delta(epsilon), None),
            (None, None) => run_budget(&file)?,
            (Some(_), Some(_)) => bail!("give --delta (for epsilon) or --eps (for delta)"),
        };
        let entries = fl_server::ledger::read(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        let named = entries.first().map(|e| e.accountant.parse()).transpose();
        let kind = match self.accountant {
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
        let mut out = json!({"epsilon": epsilon, "delta": delta, "rounds": rounds,
                             "accountant": kind.to_string(), "ledger": file});
        if let Some(at) = at {
            out["at"] = json!(at);
        }
        print(&out, self.json);
        Ok(())
    }
}

/// Epsilon at `delta`.
fn stated_epsilon(delta: f64) -> Budget {
    Budget::Epsilon {
        epsilon: f64::INFINITY,
        delta,
    }
}

/// Delta at `epsilon`.
fn stated_delta(epsilon: f64) -> Budget {
    Budget::Delta {
        epsilon,
        delta: 1.0,
    }
}

/// The run's own terms, from the checkpoint beside `ledger`: epsilon at its `privacy.delta`,
/// or for a `privacy.budget = "delta"` run delta at its `privacy.epsilon`; with which it is.
fn run_budget(ledger: &std::path::Path) -> anyhow::Result<(Budget, Option<&'static str>)> {
    let dir = ledger.parent().unwrap_or(std::path::Path::new("."));
    if !fl_server::checkpoint::Checkpoint::exists(dir) {
        bail!(
            "no run folder around {} to take the run's delta from: give --delta (for epsilon) \
             or --eps (for delta)",
            ledger.display()
        );
    }
    let config = fl_server::checkpoint::Checkpoint::read(dir)
        .with_context(|| format!("reading the checkpoint in {}", dir.display()))?
        .progress
        .config;
    Ok(match config.privacy.budget() {
        Budget::Epsilon { delta, .. } => (stated_epsilon(delta), Some("the run's privacy.delta")),
        Budget::Delta { epsilon, .. } => (stated_delta(epsilon), Some("the run's privacy.epsilon")),
    })
}

/// The ledger `given` names: the file, or `ledger.jsonl` in the run folder; an error naming
/// the path when there is none.
fn ledger_file(given: std::path::PathBuf) -> anyhow::Result<std::path::PathBuf> {
    let file = match given.is_dir() {
        true => given.join("ledger.jsonl"),
        false => given,
    };
    if !file.is_file() {
        bail!(
            "{} does not exist: give a run folder that holds a ledger.jsonl (one written by a \
             private run that completed a round), or the ledger file itself",
            file.display()
        );
    }
    Ok(file)
}

/// `fl privacy ledger --verify`: the chain, and the head of the checkpoint beside the ledger.
fn verify_ledger(file: &std::path::Path, json: bool) -> anyhow::Result<()> {
    let dir = file.parent().unwrap_or(std::path::Path::new("."));
    let anchor = match fl_server::checkpoint::Checkpoint::exists(dir) {
        true => {
            fl_server::checkpoint::Checkpoint::read(dir)
                .with_context(|| format!("reading the checkpoint in {}", dir.display()))?
                .progress
                .ledger
        }
        false => None,
    };
    let (entries, head) = fl_server::ledger::verify(file, anchor.as_ref())
        .with_context(|| format!("verifying {}", file.display()))?;
    let out = json!({"verified": true, "lines": entries.len(), "head": head.digest,
                     "checkpoint_checked": anchor.is_some(), "ledger": file});
    print(&out, json);
    Ok(())
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
    /// pld (tighter; Poisson sampling and DP-FTRL) or rdp (default: pld where it applies).
    #[arg(long)]
    accountant: Option<AccountantKind>,
    /// DP-FTRL: the rounds are tree-aggregation steps, the tree restarted every N rounds (no
    /// sampling: --q, --m, --k and --sampling are not used).
    #[arg(long, value_name = "N", conflicts_with = "min_separation")]
    tree_rounds: Option<u64>,
    /// Banded DP-FTRL: the rounds are steps of a banded matrix factorization, each client at
    /// most once every B rounds (no sampling: --q, --m, --k and --sampling are not used).
    #[arg(long, value_name = "B")]
    min_separation: Option<u64>,
    /// Banded DP-FTRL: each client at most this many times (default: B alone limits).
    #[arg(long, value_name = "K", requires = "min_separation")]
    max_participations: Option<u64>,
    /// Rounds whose participants are public (secure aggregation with central noise and
    /// `secagg.neighbours`): the Gaussian mechanism without amplification, under zero-out or
    /// replace-one neighbours (--q, --m, --k and --sampling are not used).
    #[arg(long, value_name = "NEIGHBOURS", value_parser = parse_neighbours)]
    unsampled: Option<Neighbours>,
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

fn parse_neighbours(s: &str) -> Result<Neighbours, String> {
    match s {
        "zero-out" => Ok(Neighbours::ZeroOut),
        "replace-one" => Ok(Neighbours::ReplaceOne),
        _ => Err(format!(
            "unknown neighbours `{s}` (zero-out or replace-one)"
        )),
    }
}

impl Args {
    /// Whether the rounds are accounted without sampling (DP-FTRL or public participants).
    fn unsampled_rounds(&self) -> bool {
        self.tree_rounds.is_some() || self.min_separation.is_some() || self.unsampled.is_some()
    }

    fn q(&self) -> anyhow::Result<f64> {
        if self.unsampled_rounds() {
            return Ok(1.0);
        }
        match (self.q, self.m, self.k) {
            (Some(q), None, None) => Ok(q),
            (None, Some(m), Some(k)) if k > 0.0 => Ok(m / k),
            _ => bail!("give --q, or --m and --k"),
        }
    }

    /// The accountant asked for, or PLD for Poisson sampling and RDP otherwise; PLD does not
    /// account fixed-size sampling.
    fn accountant(&self) -> anyhow::Result<AccountantKind> {
        if self.unsampled_rounds() {
            return Ok(self.accountant.unwrap_or(AccountantKind::Pld));
        }
        match (self.accountant, self.sampling) {
            (Some(AccountantKind::Pld), Sampling::Fixed) => {
                bail!("--accountant pld accounts Poisson sampling only: use rdp with fixed")
            }
            (Some(kind), _) => Ok(kind),
            (None, Sampling::Poisson) => Ok(AccountantKind::Pld),
            (None, Sampling::Fixed) => Ok(AccountantKind::Rdp),
        }
    }

    /// The Gaussian rounds that `rounds` rounds hold, as (q, sampling, count, factor), each a
    /// round at multiplier sigma / factor: under DP-FTRL the trees' nodes or the banded
    /// stream's charges, each without sampling; unsampled rounds as such, at their relation's
    /// sensitivity factor.
    fn gaussian_rounds(&self, rounds: u64) -> anyhow::Result<(f64, Sampling, u64, f64)> {
        if let Some(b) = self.min_separation {
            let charges = self.banded_stream(b).charges_in(rounds);
            return Ok((1.0, Sampling::Poisson, charges, 1.0));
        }
        Ok(match (self.tree_rounds, self.unsampled) {
            (Some(n), _) => (1.0, Sampling::Poisson, tree_nodes(rounds, n), 1.0),
            (None, Some(neighbours)) => {
                (1.0, Sampling::Poisson, rounds, neighbours.sensitivity(1.0))
            }
            (None, None) => (self.q()?, self.sampling, rounds, 1.0),
        })
    }

    /// The Gaussian round at `sigma` and how many of them `rounds` rounds hold.
    fn event(&self, sigma: f64, rounds: u64) -> anyhow::Result<(PrivacyEvent, u64)> {
        let (q, sampling, count, factor) = self.gaussian_rounds(rounds)?;
        let round = GaussianRound::new(q, sigma / factor, sampling)?;
        let event = match self.unsampled {
            Some(neighbours) => UnsampledGaussian {
                noise_multiplier: sigma,
                neighbours,
            }
            .into(),
            None => round.into(),
        };
        Ok((event, count))
    }

    /// The accountant after `rounds` rounds at `sigma`.
    fn after(&self, sigma: f64, rounds: u64) -> anyhow::Result<Box<dyn Accountant>> {
        let (event, count) = self.event(sigma, rounds)?;
        Ok(after_rounds(self.accountant()?, &event, count))
    }

    /// A banded stream at separation `b` and --max-participations, whose charges it counts
    /// (its noise is the question's).
    fn banded_stream(&self, b: u64) -> BandedRound {
        BandedRound {
            noise_multiplier: self.sigma.unwrap_or(1.0),
            step: 1,
            bands: b,
            min_separation: b,
            max_participations: self.max_participations,
            neighbours: Neighbours::ZeroOut,
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
        Question::Ledger(ledger) => return ledger.answer(),
        Question::Epsilon(a) => {
            let answer = a.epsilon_answer()?;
            (a, answer)
        }
        Question::Delta(a) => {
            let answer = a.delta_answer()?;
            (a, answer)
        }
        Question::Sigma(a) => {
            let answer = a.sigma_answer()?;
            (a, answer)
        }
        Question::Rounds(a) => {
            let answer = a.rounds_answer()?;
            (a, answer)
        }
    };
    print(&args.described(answer)?, args.json);
    Ok(())
}

impl Args {
    /// Epsilon after --rounds rounds at --delta.
    fn epsilon_answer(&self) -> anyhow::Result<serde_json::Value> {
        let delta = Args::need(self.delta, "--delta")?;
        fl_privacy::check_delta(delta)?;
        let sigma = Args::need(self.sigma, "--sigma")?;
        let acc = self.after(sigma, Args::need(self.rounds, "--rounds")?)?;
        Ok(json!({"epsilon": acc.epsilon(delta), "delta": delta}))
    }

    /// Delta after --rounds rounds at --eps.
    fn delta_answer(&self) -> anyhow::Result<serde_json::Value> {
        let eps = Args::need(self.eps, "--eps")?;
        fl_privacy::check_epsilon(eps)?;
        let sigma = Args::need(self.sigma, "--sigma")?;
        let acc = self.after(sigma, Args::need(self.rounds, "--rounds")?)?;
        Ok(json!({"epsilon": eps, "delta": acc.delta(eps)}))
    }

    /// The smallest sigma for --rounds rounds within --eps at --delta.
    fn sigma_answer(&self) -> anyhow::Result<serde_json::Value> {
        let budget = self.budget()?;
        let rounds = Args::need(self.rounds, "--rounds")?;
        let (q, sampling, count, factor) = self.gaussian_rounds(rounds)?;
        let sigma = factor * min_sigma(self.accountant()?, q, count, &budget, sampling)?;
        let delta = Args::need(self.delta, "--delta")?;
        let epsilon = self.after(sigma, rounds)?.epsilon(delta);
        Ok(json!({"sigma": sigma, "epsilon": epsilon, "delta": delta}))
    }

    /// The most rounds at --sigma within --eps at --delta.
    fn rounds_answer(&self) -> anyhow::Result<serde_json::Value> {
        let budget = self.budget()?;
        let sigma = Args::need(self.sigma, "--sigma")?;
        let (event, _) = self.event(sigma, 1)?;
        let cap = 10_000_000;
        let count = max_rounds(self.accountant()?, &event, &budget, cap)?;
        let rounds = match (self.tree_rounds, self.min_separation) {
            (Some(n), _) => tree_rounds_within(count, n),
            (None, Some(b)) => self.banded_stream(b).steps_covered(count, cap),
            (None, None) => count,
        };
        let delta = Args::need(self.delta, "--delta")?;
        let epsilon = self.after(sigma, rounds)?.epsilon(delta);
        Ok(json!({"rounds": rounds, "epsilon": epsilon, "delta": delta}))
    }

    /// The budget of --eps at --delta.
    fn budget(&self) -> anyhow::Result<Budget> {
        Ok(Budget::Epsilon {
            epsilon: Args::need(self.eps, "--eps")?,
            delta: Args::need(self.delta, "--delta")?,
        })
    }

    /// `answer` with the question's settings beside it: the accountant, the sampling or the
    /// trees, and the given figures the answer does not already hold.
    fn described(&self, mut out: serde_json::Value) -> anyhow::Result<serde_json::Value> {
        out["accountant"] = json!(self.accountant()?.to_string());
        match (self.tree_rounds, self.min_separation, self.unsampled) {
            (Some(n), _, _) => out["tree_rounds"] = json!(n),
            (None, Some(b), _) => {
                out["min_separation"] = json!(b);
                out["max_participations"] = json!(self.max_participations);
            }
            (None, None, Some(neighbours)) => out["unsampled"] = json!(neighbours),
            (None, None, None) => {
                out["sampling"] = json!(self.sampling.to_string());
                out["q"] = json!(self.q()?);
            }
        }
        for (key, value) in [("sigma", self.sigma), ("m", self.m), ("k", self.k)] {
            if let Some(v) = value
                && out.get(key).is_none()
            {
                out[key] = json!(v);
            }
        }
        if let Some(r) = self.rounds
            && out.get("rounds").is_none()
        {
            out["rounds"] = json!(r);
        }
        Ok(out)
    }
}
