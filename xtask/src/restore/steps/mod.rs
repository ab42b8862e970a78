//! The step kinds: each one a cheap `probe` ("already done?") and a `run`.
//!
//! A probe never touches the network, hashes nothing and writes nothing: it
//! looks at the file system and at stamps, so that a warm restore is a no-op
//! that takes milliseconds. `run` does the work, writes the step's log, and
//! refreshes its stamp. Neither prints: they return what happened and the
//! caller (`restore::run`) reports it.

pub mod cache;
pub mod command;
pub mod common;
pub mod doctor;
pub mod download;
pub mod freshness;
pub mod links;
pub mod pin;
pub mod service;
pub mod submodules;

use anyhow::Result;

use super::plan::{Kind, Step};
use super::proc::Log;
pub use common::{Ctx, Outcome, Probe};

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
        Kind::Doctor(s) => doctor::probe(ctx, &step.name, s),
    }
}

/// Runs the step; an `Err` is a failure like `Outcome::failed`, with its chain.
pub fn run(ctx: &Ctx, step: &Step, log: &mut Log) -> Result<Outcome> {
    match &step.kind {
        Kind::Cache(c) => cache::run(ctx, c, step.background, log),
        Kind::Submodules(s) => submodules::run(ctx, s, log),
        Kind::Links(s) => links::run(ctx, s, log),
        Kind::Command(s) => command::run(ctx, s, log),
        Kind::Download(s) => download::run(ctx, &step.name, s, log),
        Kind::Pin(s) => pin::run(ctx, &step.name, s, log),
        Kind::Freshness(s) => freshness::run(ctx, &step.name, s, log),
        Kind::Service(s) => service::run(ctx, &step.name, s, log),
        Kind::Doctor(s) => doctor::run(ctx, &step.name, s, log),
    }
}
