//! Which gate entries count, and for what: the one rule behind `gates run
//! --skip-green`, `gates check` and a publish's `[publish] gates`.
//!
//! A record is a ref that anyone who can push may write. Under `signed_gates`
//! (trust.toml's, for everything; a cache manifest's `[trust]` table, for
//! that cache's publish; `gates check --require-signed`) an entry counts only
//! when an allowed signer of HEAD signed it over exactly this tree, this gate
//! and the gate's current command digest, whether it came in the shared
//! record or from this clone's own runs (`own`). Without it, a publish takes
//! any entry with the current digest, but a skip only this clone's own: a
//! record someone else pushed never stops a gate from running here.
//!
//! Must never: skip a gate or satisfy a publish on an entry whose digest is
//! not the gate's current one, or, under `signed_gates`, on one that is not
//! trusted.

use anyhow::Result;
use std::collections::BTreeMap;
use xshell::Shell;

use super::manifest::Gate;
use super::record::{Entry, Record};
use crate::trust::gatesig::{Judge, Signed};

/// What an entry is asked to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Use {
    /// Let `gates run --skip-green` skip the gate.
    Skip,
    /// Satisfy `[publish] gates` (and `gates check`).
    Publish,
}

/// Whose entries count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// Only entries an allowed signer signed (`signed_gates`).
    Signed,
    /// No trust policy for gates: any entry to publish, this clone's own to skip.
    Open,
}

/// Where one gate stands for one use.
#[derive(Clone, Debug, PartialEq)]
pub enum Standing {
    /// This entry counts.
    Counts(Box<Entry>),
    /// No entry for the gate.
    Missing,
    /// Entries, none with the gate's current digest.
    Stale,
    /// An entry with the current digest that does not count here.
    NotEvidence(Refused),
}

/// Why a current entry does not count.
#[derive(Clone, Debug, PartialEq)]
pub enum Refused {
    /// Under `signed_gates`: what its signature is worth.
    Signature(Signed),
    /// Without a policy, a skip: the entry came from another clone.
    NotOwn,
}

impl Refused {
    pub fn why(&self) -> String {
        match self {
            Refused::Signature(s) => s.why_not(),
            Refused::NotOwn => "it was not recorded by this clone's own `gates run`".into(),
        }
    }
}

impl Standing {
    pub fn counts(&self) -> bool {
        matches!(self, Standing::Counts(_))
    }
}

/// Where `gate` stands for `use_` on tree `tree` under `rule`: the shared
/// record's entry and this clone's own (`own`, by gate name) are the
/// candidates. ssh-keygen runs only under `Rule::Signed`, once per current
/// candidate at most.
#[allow(clippy::too_many_arguments)]
pub fn standing(
    sh: &Shell,
    judge: &mut Judge,
    rule: Rule,
    use_: Use,
    tree: &str,
    gate: &Gate,
    record: Option<&Record>,
    own: &BTreeMap<String, Entry>,
) -> Result<Standing> {
    let shared = record.and_then(|r| r.gates.get(&gate.name));
    let mine = own.get(&gate.name);
    let current = |e: &&Entry| e.digest == gate.digest;
    let absent = if shared.is_none() && mine.is_none() {
        Standing::Missing
    } else {
        Standing::Stale
    };
    match (rule, use_) {
        (Rule::Signed, _) => {
            let mut refused = None;
            for e in [shared, mine].into_iter().flatten().filter(current) {
                let signed = judge.judge(sh, tree, &gate.name, e)?;
                if signed.trusted() {
                    return Ok(Standing::Counts(Box::new(e.clone())));
                }
                refused.get_or_insert(signed);
            }
            Ok(refused.map_or(absent, |s| Standing::NotEvidence(Refused::Signature(s))))
        }
        (Rule::Open, Use::Skip) => Ok(match (mine.filter(current), shared.filter(current)) {
            (Some(e), _) => Standing::Counts(Box::new(e.clone())),
            (None, Some(_)) => Standing::NotEvidence(Refused::NotOwn),
            (None, None) => absent,
        }),
        (Rule::Open, Use::Publish) => Ok(match shared.filter(current).or(mine.filter(current)) {
            Some(e) => Standing::Counts(Box::new(e.clone())),
            None => absent,
        }),
    }
}
