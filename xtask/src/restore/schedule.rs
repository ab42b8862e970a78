//! The opt-in parallel order of a restore plan: which steps may run now.
//!
//! Without `parallel` at the top of restore.toml, `restore/mod.rs` runs the
//! steps one by one in file order, as it always did, and nothing here is
//! used. With it, file order is no longer a dependency: a step waits only for
//! the steps its `after` names, and at most `limit` run at once.
//!
//! Three parts, so the order can be tested without processes:
//! - `check_order` (called by `plan::parse`): `after` names steps of the
//!   file, never itself, and makes no cycle; one-line errors naming them.
//! - `Scheduler`, a pure state machine: what may start now, what is skipped
//!   because a step it waits for failed, what is left after a fatal failure.
//!   It never starts a step before all of its `after` steps ended well, never
//!   more than `limit`, never two `exclusive` steps at once (steps that write
//!   this repository's own git state: `submodules` and `freshness` would
//!   fight over `.git/config` and `.git/index` locks).
//! - `run`: drives it with one thread per running step; results come back in
//!   file order, so the table keeps the file order.
//!
//! It never decides what a step's result means: the caller says whether a
//! run ended well, failed (fail-open) or failed fatally.

use anyhow::{Result, anyhow};
use std::collections::BTreeMap;
use std::sync::mpsc;

/// One step as the scheduler sees it.
#[derive(Clone, Debug)]
pub struct Node {
    /// Indices of the steps it waits for.
    pub after: Vec<usize>,
    /// At most one exclusive step runs at a time.
    pub exclusive: bool,
}

/// How a step that ran ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    Ok,
    /// Failed, and the restore goes on (fail-open): its dependents are skipped.
    Failed,
    /// Failed fatally (`--strict`, `fail_open = false`): nothing new starts.
    Fatal,
}

/// Why a step did not run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Skip {
    /// A step it waits for (directly or through others) failed: that one.
    AfterFailed(usize),
    /// A step failed fatally before this one could start.
    Stopped,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Pending,
    Running,
    Ended(End),
    Skipped(Skip),
}

/// The default limit of `parallel = true`: twice the cores (steps mostly
/// wait on the network), at least 2, at most 16.
pub fn default_limit() -> usize {
    std::thread::available_parallelism()
        .map_or(2, |n| n.get() * 2)
        .clamp(2, 16)
}

/// Checks the `after` lists of a plan (names in file order): every name is
/// a step of the plan and not the step itself, and there is no cycle.
pub fn check_order(names: &[&str], after: &[Vec<String>]) -> Result<(), String> {
    let index: BTreeMap<&str, usize> = names.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let mut edges: Vec<Vec<usize>> = Vec::with_capacity(names.len());
    for (i, list) in after.iter().enumerate() {
        let mut mine = Vec::new();
        for a in list {
            match index.get(a.as_str()) {
                None => {
                    return Err(format!(
                        "step {:?}: `after` names {a:?}, which is not a step of this file (steps are {})",
                        names[i],
                        names.join(", ")
                    ));
                }
                Some(&j) if j == i => {
                    return Err(format!(
                        "step {:?} is `after` itself: drop its own name from `after`",
                        names[i]
                    ));
                }
                Some(&j) => mine.push(j),
            }
        }
        edges.push(mine);
    }
    match find_cycle(&edges) {
        None => Ok(()),
        Some(cycle) => {
            let mut shown: Vec<&str> = cycle.iter().map(|&i| names[i]).collect();
            shown.push(names[cycle[0]]);
            Err(format!(
                "steps {} wait for each other in a cycle (`after`): drop one of these `after` entries",
                shown.join(" -> ")
            ))
        }
    }
}

/// A cycle of the graph "i waits for edges[i]", as the steps on it in the
/// order "waits for", starting at its smallest index; `None` when acyclic.
fn find_cycle(edges: &[Vec<usize>]) -> Option<Vec<usize>> {
    // Iterative depth-first search: 0 unseen, 1 on the path, 2 done.
    let mut mark = vec![0u8; edges.len()];
    for start in 0..edges.len() {
        if mark[start] != 0 {
            continue;
        }
        let mut path: Vec<(usize, usize)> = vec![(start, 0)];
        mark[start] = 1;
        while let Some(&mut (node, ref mut next)) = path.last_mut() {
            if let Some(&to) = edges[node].get(*next) {
                *next += 1;
                match mark[to] {
                    0 => {
                        mark[to] = 1;
                        path.push((to, 0));
                    }
                    1 => {
                        let from = path.iter().position(|&(n, _)| n == to).unwrap_or(0);
                        let mut cycle: Vec<usize> = path[from..].iter().map(|&(n, _)| n).collect();
                        let low = (0..cycle.len()).min_by_key(|&k| cycle[k]).unwrap_or(0);
                        cycle.rotate_left(low);
                        return Some(cycle);
                    }
                    _ => {}
                }
            } else {
                mark[node] = 2;
                path.pop();
            }
        }
    }
    None
}

/// The state machine of one parallel run (pure: no threads, no clock).
pub struct Scheduler<'a> {
    nodes: &'a [Node],
    status: Vec<Status>,
    limit: usize,
    stopped: bool,
}

impl<'a> Scheduler<'a> {
    /// `nodes` must be acyclic (`check_order`); a limit of 0 counts as 1.
    pub fn new(nodes: &'a [Node], limit: usize) -> Scheduler<'a> {
        Scheduler {
            nodes,
            status: vec![Status::Pending; nodes.len()],
            limit: limit.max(1),
            stopped: false,
        }
    }

    pub fn status(&self) -> &[Status] {
        &self.status
    }

    pub fn running(&self) -> usize {
        self.status
            .iter()
            .filter(|s| **s == Status::Running)
            .count()
    }

    /// Nothing is pending and nothing runs.
    pub fn is_over(&self) -> bool {
        !self
            .status
            .iter()
            .any(|s| matches!(s, Status::Pending | Status::Running))
    }

    /// Starts nothing new from now on (an error of our own, not a step's).
    pub fn stop(&mut self) {
        self.stopped = true;
        self.settle();
    }

    /// Records how a running step ended.
    pub fn finish(&mut self, i: usize, end: End) {
        debug_assert_eq!(self.status[i], Status::Running);
        self.status[i] = Status::Ended(end);
        if end == End::Fatal {
            self.stopped = true;
        }
    }

    /// Marks what can no longer run, then returns the steps to start now
    /// (in file order), marked running.
    pub fn start(&mut self) -> Vec<usize> {
        self.settle();
        let mut started = Vec::new();
        let mut running = self.running();
        let mut exclusive_busy = self.busy_exclusive();
        for i in 0..self.nodes.len() {
            if running >= self.limit {
                break;
            }
            if self.status[i] != Status::Pending {
                continue;
            }
            let ready = self.nodes[i]
                .after
                .iter()
                .all(|&j| self.status[j] == Status::Ended(End::Ok));
            if !ready || (self.nodes[i].exclusive && exclusive_busy) {
                continue;
            }
            self.status[i] = Status::Running;
            exclusive_busy |= self.nodes[i].exclusive;
            running += 1;
            started.push(i);
        }
        started
    }

    fn busy_exclusive(&self) -> bool {
        self.nodes
            .iter()
            .zip(&self.status)
            .any(|(n, s)| n.exclusive && *s == Status::Running)
    }

    /// Skips every pending step that can no longer run, to a fixed point
    /// (a step may wait for one later in the file).
    fn settle(&mut self) {
        loop {
            let mut changed = false;
            for i in 0..self.nodes.len() {
                if self.status[i] != Status::Pending {
                    continue;
                }
                let why = self.nodes[i]
                    .after
                    .iter()
                    .find_map(|&j| match self.status[j] {
                        Status::Ended(End::Failed | End::Fatal) => Some(Skip::AfterFailed(j)),
                        Status::Skipped(Skip::AfterFailed(root)) => Some(Skip::AfterFailed(root)),
                        Status::Skipped(Skip::Stopped) => Some(Skip::Stopped),
                        _ => None,
                    })
                    .or(self.stopped.then_some(Skip::Stopped));
                if let Some(why) = why {
                    self.status[i] = Status::Skipped(why);
                    changed = true;
                }
            }
            if !changed {
                return;
            }
        }
    }
}

/// Runs `work` for every node as the scheduler allows, each on its own
/// thread. Returns, in file order, what each run returned or why it was
/// skipped. The first `Err` stops new starts; it is returned once the
/// running steps have ended. A panic in a step is resumed here likewise.
pub fn run<T: Send>(
    nodes: &[Node],
    limit: usize,
    work: impl Fn(usize) -> Result<(T, End)> + Sync,
    mut on_change: impl FnMut(&[Status]),
) -> Result<Vec<std::result::Result<T, Skip>>> {
    let mut sched = Scheduler::new(nodes, limit);
    let mut results: Vec<Option<T>> = (0..nodes.len()).map(|_| None).collect();
    let mut error: Option<anyhow::Error> = None;
    let mut panic = None;
    std::thread::scope(|scope| {
        let (tx, rx) = mpsc::channel();
        loop {
            for i in sched.start() {
                let tx = tx.clone();
                let work = &work;
                scope.spawn(move || {
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(i)));
                    // The receiver lives until every started step reported.
                    let _ = tx.send((i, r));
                });
            }
            on_change(sched.status());
            if sched.running() == 0 {
                break;
            }
            let Ok((i, r)) = rx.recv() else { break };
            match r {
                Ok(Ok((value, end))) => {
                    results[i] = Some(value);
                    sched.finish(i, end);
                }
                Ok(Err(e)) => {
                    sched.finish(i, End::Fatal);
                    sched.stop();
                    error.get_or_insert(e);
                }
                Err(p) => {
                    sched.finish(i, End::Fatal);
                    sched.stop();
                    panic.get_or_insert(p);
                }
            }
        }
    });
    if let Some(p) = panic {
        std::panic::resume_unwind(p);
    }
    if let Some(e) = error {
        return Err(e);
    }
    sched.stop();
    let status = sched.status().to_vec();
    results
        .into_iter()
        .zip(status)
        .enumerate()
        .map(|(i, (value, st))| match (value, st) {
            (Some(v), Status::Ended(_)) => Ok(Ok(v)),
            (None, Status::Skipped(why)) => Ok(Err(why)),
            (_, st) => Err(anyhow!("step {i} left in state {st:?} by the scheduler")),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("s{i}")).collect()
    }

    fn check(after: &[&[&str]]) -> Result<(), String> {
        let names = names(after.len());
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let after: Vec<Vec<String>> = after
            .iter()
            .map(|l| l.iter().map(|s| s.to_string()).collect())
            .collect();
        check_order(&refs, &after)
    }

    #[test]
    fn unknown_self_and_cyclic_after_are_refused_naming_the_steps() {
        assert_eq!(check(&[&[], &["s0"], &["s0", "s1"]]), Ok(()));
        let e = check(&[&[], &["nope"]]).unwrap_err();
        assert!(e.contains("step \"s1\": `after` names \"nope\""), "{e}");
        assert!(e.contains("steps are s0, s1"), "{e}");
        let e = check(&[&["s0"]]).unwrap_err();
        assert!(e.contains("step \"s0\" is `after` itself"), "{e}");
        let e = check(&[&["s2"], &["s0"], &["s1"], &[]]).unwrap_err();
        assert!(e.contains("steps s0 -> s2 -> s1 -> s0"), "{e}");
        let e = check(&[&[], &["s2"], &["s1"]]).unwrap_err();
        assert!(e.contains("steps s1 -> s2 -> s1"), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }

    use crate::test_rng::Rng;

    /// Kahn's algorithm: an independent answer to "is there a cycle".
    fn acyclic(edges: &[Vec<usize>]) -> bool {
        let mut waits: Vec<usize> = edges.iter().map(Vec::len).collect();
        let mut done = vec![false; edges.len()];
        loop {
            let Some(i) = (0..edges.len()).find(|&i| !done[i] && waits[i] == 0) else {
                return done.iter().all(|d| *d);
            };
            done[i] = true;
            for (k, e) in edges.iter().enumerate() {
                waits[k] -= e.iter().filter(|&&j| j == i).count();
            }
        }
    }

    #[test]
    fn cycle_check_agrees_with_kahn_on_random_graphs() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..2000 {
            let n = 1 + rng.index(7);
            let edges: Vec<Vec<usize>> = (0..n)
                .map(|i| {
                    (0..rng.index(3))
                        .map(|_| rng.index(n))
                        .filter(|&j| j != i)
                        .collect()
                })
                .collect();
            let cycle = find_cycle(&edges);
            assert_eq!(cycle.is_none(), acyclic(&edges), "{edges:?}");
            if let Some(c) = cycle {
                for k in 0..c.len() {
                    assert!(
                        edges[c[k]].contains(&c[(k + 1) % c.len()]),
                        "{c:?} {edges:?}"
                    );
                }
            }
        }
    }

    /// Random acyclic plans, limits, failures and completion orders: the
    /// scheduler never breaks its promises.
    #[test]
    fn scheduler_keeps_its_promises_on_random_plans() {
        let mut rng = Rng(0xdead_beef_cafe_f00d);
        for _ in 0..3000 {
            let n = 1 + rng.index(9);
            // Edges only to lower indices of a random permutation: acyclic,
            // yet a step may wait for one later in the file.
            let mut perm: Vec<usize> = (0..n).collect();
            for i in (1..n).rev() {
                perm.swap(i, rng.index(i + 1));
            }
            let mut nodes = vec![
                Node {
                    after: vec![],
                    exclusive: false
                };
                n
            ];
            for k in 1..n {
                for _ in 0..rng.index(3) {
                    let dep = perm[rng.index(k)];
                    if !nodes[perm[k]].after.contains(&dep) {
                        nodes[perm[k]].after.push(dep);
                    }
                }
            }
            for node in nodes.iter_mut() {
                node.exclusive = rng.index(4) == 0;
            }
            let ends: Vec<End> = (0..n)
                .map(|_| match rng.index(10) {
                    0 => End::Failed,
                    1 => End::Fatal,
                    _ => End::Ok,
                })
                .collect();
            let limit = 1 + rng.index(4);
            let mut s = Scheduler::new(&nodes, limit);
            let mut running: Vec<usize> = Vec::new();
            let mut fatal_seen = false;
            loop {
                for i in s.start() {
                    assert!(!fatal_seen, "started {i} after a fatal failure");
                    for &j in &nodes[i].after {
                        assert_eq!(s.status()[j], Status::Ended(End::Ok), "{i} before {j}");
                    }
                    running.push(i);
                }
                assert!(running.len() <= limit);
                assert!(running.iter().filter(|&&i| nodes[i].exclusive).count() <= 1);
                if running.is_empty() {
                    break;
                }
                let i = running.remove(rng.index(running.len()));
                s.finish(i, ends[i]);
                fatal_seen |= ends[i] == End::Fatal;
            }
            assert!(s.is_over(), "{:?}", s.status());
            for (i, st) in s.status().iter().enumerate() {
                match st {
                    Status::Ended(e) => assert_eq!(*e, ends[i]),
                    Status::Skipped(Skip::AfterFailed(root)) => {
                        assert!(matches!(ends[*root], End::Failed | End::Fatal));
                        assert!(matches!(s.status()[*root], Status::Ended(_)));
                    }
                    Status::Skipped(Skip::Stopped) => assert!(fatal_seen),
                    other => panic!("{i} ended {other:?}"),
                }
            }
        }
    }

    #[test]
    fn limit_one_without_after_is_file_order() {
        let nodes = vec![
            Node {
                after: vec![],
                exclusive: false
            };
            5
        ];
        let mut s = Scheduler::new(&nodes, 1);
        let mut order = Vec::new();
        loop {
            let started = s.start();
            assert!(started.len() <= 1);
            let Some(&i) = started.first() else { break };
            order.push(i);
            s.finish(i, End::Ok);
        }
        assert_eq!(order, [0, 1, 2, 3, 4]);
    }

    #[test]
    fn exclusive_steps_wait_for_each_other_but_not_for_others() {
        let nodes = vec![
            Node {
                after: vec![],
                exclusive: true,
            },
            Node {
                after: vec![],
                exclusive: true,
            },
            Node {
                after: vec![],
                exclusive: false,
            },
        ];
        let mut s = Scheduler::new(&nodes, 8);
        assert_eq!(s.start(), [0, 2]);
        assert_eq!(s.start(), Vec::<usize>::new());
        s.finish(0, End::Failed);
        assert_eq!(s.start(), [1]);
    }

    #[test]
    fn dependents_of_a_failure_are_skipped_naming_the_root() {
        let nodes = vec![
            Node {
                after: vec![],
                exclusive: false,
            },
            Node {
                after: vec![0],
                exclusive: false,
            },
            Node {
                after: vec![1],
                exclusive: false,
            },
            Node {
                after: vec![],
                exclusive: false,
            },
        ];
        let seen = AtomicUsize::new(0);
        let out = run(
            &nodes,
            4,
            |i| {
                seen.fetch_add(1, Ordering::SeqCst);
                Ok((i * 10, if i == 0 { End::Failed } else { End::Ok }))
            },
            |_| {},
        )
        .unwrap();
        assert_eq!(
            out,
            vec![
                Ok(0),
                Err(Skip::AfterFailed(0)),
                Err(Skip::AfterFailed(0)),
                Ok(30)
            ]
        );
        assert_eq!(seen.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn an_error_stops_new_starts_and_is_returned() {
        let nodes = vec![
            Node {
                after: vec![],
                exclusive: false,
            },
            Node {
                after: vec![0],
                exclusive: false,
            },
        ];
        let e = run(
            &nodes,
            2,
            |i| {
                if i == 0 {
                    Err(anyhow!("locking state.lock"))
                } else {
                    Ok(((), End::Ok))
                }
            },
            |_| {},
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "locking state.lock");
    }
}
