//! `fl privacy`: planning a private run with the accountant the server uses.

use anyhow::{Context, bail};
use fl_privacy::{
    Accountant, AccountantKind, AnyStream, Budget, Charges, GaussianRound, Neighbours, NoiseStream,
    PrivacyEvent, Sampling, StreamRun, StreamSettings, UnsampledGaussian, after_rounds, max_rounds,
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
    /// DP-FTRL: the rounds are steps of a noise stream, its name and the keys of its table
    /// (`[privacy.noise.NAME]`), e.g. `tree:rounds=4` or
    /// `banded:min_separation=4,max_participations=13`; a period left unset is K / m (--k, --m).
    /// No sampling: --q and --sampling are not used.
    #[arg(long, value_name = "NAME[:KEY=VALUE,...]", value_parser = parse_stream,
          conflicts_with = "unsampled")]
    noise: Option<StreamSettings>,
    /// Moved: `--noise tree:rounds=N`.
    #[arg(long, hide = true, conflicts_with_all = ["noise", "unsampled"])]
    tree_rounds: Option<u64>,
    /// Moved: `--noise banded:min_separation=B`.
    #[arg(long, hide = true, conflicts_with_all = ["noise", "tree_rounds", "unsampled"])]
    min_separation: Option<u64>,
    /// Moved: `--noise banded:max_participations=K`.
    #[arg(long, hide = true, requires = "min_separation")]
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

/// A stream's settings from `NAME[:KEY=VALUE,...]`, each VALUE in TOML, read as its table is.
fn parse_stream(s: &str) -> Result<StreamSettings, String> {
    let (name, keys) = s.split_once(':').unwrap_or((s, ""));
    let keys: Vec<&str> = keys.split(',').filter(|k| !k.trim().is_empty()).collect();
    let table = format!("[{name}]\n{}\n", keys.join("\n"));
    toml::from_str(&table).map_err(|e| e.message().to_string())
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
    /// Reads the moved flags as --noise, saying so in one line.
    fn read_moved_flags(mut self) -> anyhow::Result<Self> {
        let (flag, now) = match (self.tree_rounds.take(), self.min_separation.take()) {
            (Some(n), _) => ("--tree-rounds", format!("tree:rounds={n}")),
            (None, Some(b)) => {
                let k = (self.max_participations.take())
                    .map_or(String::new(), |k| format!(",max_participations={k}"));
                ("--min-separation", format!("banded:min_separation={b}{k}"))
            }
            (None, None) => return Ok(self),
        };
        eprintln!("warning: {flag} has moved: read as --noise {now}");
        self.noise = Some(parse_stream(&now).map_err(anyhow::Error::msg)?);
        Ok(self)
    }

    /// The DP-FTRL stream at multiplier `sigma`, planned as a run of --k clients, --m per step
    /// and --rounds steps would plan it.
    fn stream(&self, sigma: f64) -> anyhow::Result<Option<AnyStream>> {
        let Some(settings) = &self.noise else {
            return Ok(None);
        };
        let run = StreamRun {
            noise_multiplier: sigma,
            one_pass: (self.k.zip(self.m)).map(|(k, m)| (k / m.max(1.0)).max(1.0) as u64),
            buffer: None,
            rounds: self.rounds.unwrap_or(1),
            momentum: 0.0,
            ledger: None,
        };
        let stream = AnyStream::plan(settings, &run)
            .with_context(|| format!("--noise {}", settings.name()))?;
        Ok(Some(stream))
    }

    /// Whether the rounds are accounted without sampling (DP-FTRL or public participants).
    fn unsampled_rounds(&self) -> bool {
        self.noise.is_some() || self.unsampled.is_some()
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

    /// The Gaussian mechanisms that `rounds` rounds at `sigma` compose as: under DP-FTRL what
    /// the stream says, unsampled rounds at their relation's sensitivity, sampled rounds as
    /// such.
    fn charges(&self, sigma: f64, rounds: u64) -> anyhow::Result<Charges> {
        if let Some(stream) = self.stream(sigma)? {
            return Ok(stream.charges(rounds));
        }
        let charge = match self.unsampled {
            Some(neighbours) => {
                GaussianRound::new(1.0, sigma / neighbours.sensitivity(1.0), Sampling::Poisson)?
            }
            None => GaussianRound::new(self.q()?, sigma, self.sampling)?,
        };
        Ok(Charges {
            charge,
            count: rounds,
        })
    }

    /// The event that `rounds` rounds at `sigma` compose, and how many of it.
    fn event(&self, sigma: f64, rounds: u64) -> anyhow::Result<(PrivacyEvent, u64)> {
        let Charges { charge, count } = self.charges(sigma, rounds)?;
        let event = match self.unsampled {
            Some(neighbours) => UnsampledGaussian {
                noise_multiplier: sigma,
                neighbours,
            }
            .into(),
            None => charge.into(),
        };
        Ok((event, count))
    }

    /// The accountant after `rounds` rounds at `sigma`.
    fn after(&self, sigma: f64, rounds: u64) -> anyhow::Result<Box<dyn Accountant>> {
        let (event, count) = self.event(sigma, rounds)?;
        Ok(after_rounds(self.accountant()?, &event, count))
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
    let (args, answer): (Args, fn(&Args) -> anyhow::Result<serde_json::Value>) = match question {
        Question::Ledger(ledger) => return ledger.answer(),
        Question::Epsilon(a) => (a, Args::epsilon_answer),
        Question::Delta(a) => (a, Args::delta_answer),
        Question::Sigma(a) => (a, Args::sigma_answer),
        Question::Rounds(a) => (a, Args::rounds_answer),
    };
    let args = args.read_moved_flags()?;
    let answer = answer(&args)?;
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
        // Every charge's multiplier is sigma over a factor of the relation: at sigma = 1 it is
        // 1 / factor.
        let Charges { charge, count } = self.charges(1.0, rounds)?;
        let (q, sampling) = (charge.q, charge.sampling);
        let least = min_sigma(self.accountant()?, q, count, &budget, sampling)?;
        let sigma = least / charge.noise_multiplier;
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
        let rounds = match self.stream(sigma)? {
            Some(stream) => stream.steps_within(count, cap),
            None => count,
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
        match (&self.noise, self.unsampled) {
            (Some(settings), _) => out["noise"] = json!(settings),
            (None, Some(neighbours)) => out["unsampled"] = json!(neighbours),
            (None, None) => {
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// `fl privacy`'s questions, as the command line gives them.
    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        question: Question,
    }

    fn args(line: &str) -> Args {
        let words = std::iter::once("privacy").chain(line.split_whitespace());
        match Cli::try_parse_from(words).unwrap().question {
            Question::Epsilon(a)
            | Question::Delta(a)
            | Question::Sigma(a)
            | Question::Rounds(a) => a.read_moved_flags().unwrap(),
            Question::Ledger(_) => panic!("not a planning question"),
        }
    }

    /// The moved flags read as the stream they name, and ask it the same question; an unknown
    /// key of a stream's table is refused naming it.
    #[test]
    fn moved_flags_read_as_the_stream_they_name() {
        let question = "sigma --rounds 100 --eps 8 --delta 1e-5";
        let pairs = [
            ("--tree-rounds 4", "--noise tree:rounds=4"),
            ("--min-separation 4", "--noise banded:min_separation=4"),
            (
                "--min-separation 4 --max-participations 13",
                "--noise banded:min_separation=4,max_participations=13",
            ),
        ];
        for (old, new) in pairs {
            let (old, new) = (
                args(&format!("{question} {old}")),
                args(&format!("{question} {new}")),
            );
            assert_eq!(old.noise, new.noise);
            assert_eq!(old.sigma_answer().unwrap(), new.sigma_answer().unwrap());
        }
        let words = ["privacy", "epsilon", "--noise", "banded:bandz=3"];
        let refused = Cli::try_parse_from(words).err().unwrap().to_string();
        assert!(refused.contains("unknown field `bandz`"), "{refused}");
    }
}
