//! The probe subcommands, built from the probe registry with clap's builder API: one subcommand
//! per probe (plus `diagnose`), each with the shared [`DeviceArgs`], and a probe that is another
//! probe's flag (`layout --infer`) as that flag.

use clap::{ArgAction, ArgMatches, Args, Command, FromArgMatches, Subcommand};
use kvprobe_probes::{Probe, PROBES};

use crate::cli::device_args::DeviceArgs;

const DIAGNOSE: &str = "diagnose";
const DIAGNOSE_ABOUT: &str = "Run the probes and name the root cause";

/// A probe subcommand as parsed: the probe (`None` = `diagnose`) and the shared arguments.
pub struct ProbeCommand {
    pub probe: Option<&'static dyn Probe>,
    pub args: DeviceArgs,
}

impl ProbeCommand {
    /// The run's name: the probe's, or `diagnose`.
    pub fn name(&self) -> &'static str {
        self.probe.map_or(DIAGNOSE, |p| p.name())
    }
}

impl std::fmt::Debug for ProbeCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeCommand")
            .field("probe", &self.name())
            .field("args", &self.args)
            .finish()
    }
}

/// The probes a subcommand's flags select, as (long, probe).
fn flags_of(subcommand: &str) -> impl Iterator<Item = (&'static str, &'static dyn Probe)> + '_ {
    PROBES.iter().filter_map(move |p| match p.flag_of() {
        Some((sub, long)) if sub == subcommand => Some((long, *p)),
        _ => None,
    })
}

fn subcommand(name: &'static str, about: &'static str) -> Command {
    let mut cmd = DeviceArgs::augment_args(Command::new(name));
    for (long, p) in flags_of(name) {
        cmd = cmd.arg(
            clap::Arg::new(long)
                .long(long)
                .action(ArgAction::SetTrue)
                .help(p.about()),
        );
    }
    cmd.about(about).long_about(None)
}

impl Subcommand for ProbeCommand {
    fn augment_subcommands(mut cmd: Command) -> Command {
        for p in PROBES.iter().filter(|p| p.flag_of().is_none()) {
            cmd = cmd.subcommand(subcommand(p.name(), p.about()));
        }
        cmd.subcommand(subcommand(DIAGNOSE, DIAGNOSE_ABOUT))
    }

    fn augment_subcommands_for_update(cmd: Command) -> Command {
        Self::augment_subcommands(cmd)
    }

    fn has_subcommand(name: &str) -> bool {
        name == DIAGNOSE
            || PROBES
                .iter()
                .any(|p| p.flag_of().is_none() && p.name() == name)
    }
}

impl FromArgMatches for ProbeCommand {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let Some((name, sub)) = m.subcommand() else {
            return Err(clap::Error::raw(
                clap::error::ErrorKind::MissingSubcommand,
                "A subcommand is required but one was not provided.",
            ));
        };
        let args = DeviceArgs::from_arg_matches(sub)?;
        if name == DIAGNOSE {
            return Ok(ProbeCommand { probe: None, args });
        }
        let flagged = flags_of(name).find(|(long, _)| sub.get_flag(long));
        let probe = match flagged {
            Some((_, p)) => Some(p),
            None => PROBES.iter().copied().find(|p| p.name() == name),
        };
        match probe {
            Some(p) => Ok(ProbeCommand {
                probe: Some(p),
                args,
            }),
            None => Err(clap::Error::raw(
                clap::error::ErrorKind::InvalidSubcommand,
                format!("The subcommand '{name}' wasn't recognized"),
            )),
        }
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}
