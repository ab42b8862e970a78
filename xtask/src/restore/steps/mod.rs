//! The step kinds: each one a cheap `probe` ("already done?") and a `run`.
//!
//! A probe never touches the network, hashes nothing and writes nothing: it
//! looks at the file system and at stamps, so that a warm restore is a no-op
//! that takes milliseconds. `run` does the work, writes the step's log, and
//! refreshes its stamp. Neither prints: they return what happened and the
//! caller (`restore::run`) reports it.

pub mod cache;
pub mod command;
pub mod download;
pub mod freshness;
pub mod links;
pub mod pin;
pub mod service;
pub mod submodules;

use anyhow::Result;
use serde_json::Value;

use super::plan::{Kind, Step};
use super::proc::Log;
use super::state::Paths;
use crate::repo::Repo;

/// What every step may use.
pub struct Ctx<'a> {
    pub sh: &'a xshell::Shell,
    pub repo: &'a Repo,
    pub paths: &'a Paths,
}

/// The answer of a probe.
#[derive(Debug)]
pub enum Probe {
    /// Already done: nothing to run. Warnings still reach the user.
    Warm { what: String, warnings: Vec<String> },
    /// Done with a stand-in (a cache's fallback key): nothing to run now.
    /// `partial` names the key used and what differs (the row's JSON).
    Partial { what: String, partial: Value },
    /// Work to do, and why.
    Needed(String),
}

impl Probe {
    pub fn warm(what: impl Into<String>) -> Probe {
        Probe::Warm {
            what: what.into(),
            warnings: Vec::new(),
        }
    }
}

/// What a run did. `failed` with the reason in `what`; `warnings` are whole
/// lines for the user (e.g. `MISSING <suite> <path> -> breaks: <what>`).
#[derive(Debug)]
pub struct Outcome {
    pub what: String,
    pub warnings: Vec<String>,
    pub failed: bool,
    /// Done with a stand-in (see `Probe::Partial`).
    pub partial: Option<Value>,
}

impl Outcome {
    pub fn done(what: impl Into<String>) -> Outcome {
        Outcome {
            what: what.into(),
            warnings: Vec::new(),
            failed: false,
            partial: None,
        }
    }

    pub fn failed(what: impl Into<String>) -> Outcome {
        Outcome {
            what: what.into(),
            warnings: Vec::new(),
            failed: true,
            partial: None,
        }
    }

    pub fn with_warnings(mut self, warnings: Vec<String>) -> Outcome {
        self.warnings = warnings;
        self
    }

    pub fn with_partial(mut self, partial: Option<Value>) -> Outcome {
        self.partial = partial;
        self
    }
}

pub fn probe(ctx: &Ctx, step: &Step) -> Probe {
    match &step.kind {
        Kind::Cache(c) => cache::probe(ctx, c),
        Kind::Submodules(s) => submodules::probe(ctx, s),
        Kind::Links(s) => links::probe(ctx, s),
        Kind::Command(s) => command::probe(ctx, s),
        Kind::Download(s) => download::probe(ctx, &step.name, s),
        Kind::Pin(s) => pin::probe(ctx, &step.name, s),
        Kind::Freshness(s) => freshness::probe(ctx, &step.name, s),
        Kind::Service(s) => service::probe(ctx, &step.name, s),
    }
}

/// Runs the step; an `Err` is a failure like `Outcome::failed`, with its chain.
pub fn run(ctx: &Ctx, step: &Step, log: &mut Log) -> Result<Outcome> {
    match &step.kind {
        Kind::Cache(c) => cache::run(ctx, c, log),
        Kind::Submodules(s) => submodules::run(ctx, s, log),
        Kind::Links(s) => links::run(ctx, s, log),
        Kind::Command(s) => command::run(ctx, s, log),
        Kind::Download(s) => download::run(ctx, &step.name, s, log),
        Kind::Pin(s) => pin::run(ctx, &step.name, s, log),
        Kind::Freshness(s) => freshness::run(ctx, &step.name, s, log),
        Kind::Service(s) => service::run(ctx, &step.name, s, log),
    }
}
