//! A gflags-compatible command line, shared by every binary of this stack
//! (`mooncake_master`, `mooncake_client`): each program declares its own
//! flag table ([`FlagDef`] rows) and parses its arguments with the rules
//! gflags applies to upstream's binaries.
//!
//! Syntax: `--flag=value`, `-flag value`, `--flag` / `--noflag` for booleans,
//! `--` ends the flags, positional arguments are ignored. Built-ins
//! ([`COMMON_FLAGS`]): `--help*`, `--version`, `--flagfile`, `--config_path`
//! (a JSON object of flag -> value, overridden by the command line),
//! `--undefok`, `--fromenv` / `--tryfromenv`, and glog's logging flags,
//! which map onto a `tracing` level ([`Flags::log_level`]). An unknown flag,
//! an ill-typed value or a missing argument exits with status 1 and gflags'
//! own message (`ERROR: unknown command line flag 'x'`, ...).

use std::collections::{HashMap, HashSet};

/// Value type of a flag, as gflags names it in error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlagType {
    /// `true/false/t/f/yes/no/y/n/1/0`, or bare `--flag` / `--noflag`.
    Bool,
    /// Signed 32-bit integer.
    Int32,
    /// Signed 64-bit integer.
    Int64,
    /// Unsigned 32-bit integer.
    Uint32,
    /// Unsigned 64-bit integer.
    Uint64,
    /// Floating point.
    Double,
    /// Any string.
    Str,
    /// Non-negative integer with optional `ms`/`s`/`m`/`h` suffix; stored in ms.
    Duration,
}

impl FlagType {
    /// The gflags type name (`int32`, `bool`, …).
    pub fn name(self) -> &'static str {
        match self {
            FlagType::Bool => "bool",
            FlagType::Int32 => "int32",
            FlagType::Int64 => "int64",
            FlagType::Uint32 => "uint32",
            FlagType::Uint64 => "uint64",
            FlagType::Double => "double",
            FlagType::Str => "string",
            FlagType::Duration => "duration",
        }
    }
}

/// What a program does with a flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlagRole {
    /// Implemented: feeds the program's configuration.
    Core,
    /// Mapped onto our stderr logger.
    Log,
    /// Switch or setting of an unimplemented feature: any value other than
    /// the default (`true` for a switch) fails fast.
    Feature(&'static str),
    /// Feature switch whose guarantee this build provides by another
    /// mechanism (named in the text): `true` fails fast with that text.
    Replaced(&'static str),
    /// Recognised and type-checked, but not implemented: the default is
    /// accepted and any other value fails fast, naming the flag (a knob is
    /// never accepted and then ignored).
    Unsupported,
    /// gflags built-in handled by the parser itself (help, flagfile, …).
    Builtin,
}

/// One row of a flag table.
#[derive(Debug)]
pub struct FlagDef {
    /// Flag name without dashes.
    pub name: &'static str,
    /// Value type.
    pub ty: FlagType,
    /// Default value, in command-line syntax.
    pub default: &'static str,
    /// How the program treats it.
    pub role: FlagRole,
    /// One-line description for `--help`.
    pub help: &'static str,
}

/// A [`FlagDef`] row (for the `static` tables).
pub const fn f(
    name: &'static str,
    ty: FlagType,
    default: &'static str,
    role: FlagRole,
    help: &'static str,
) -> FlagDef {
    FlagDef {
        name,
        ty,
        default,
        role,
        help,
    }
}

use FlagRole::{Builtin, Feature, Log, Replaced, Unsupported};
use FlagType::{Bool, Int32, Str};

/// Help text of flags this build does not implement (only their default is
/// accepted).
pub const IGN: &str = "not implemented by this build: any value but the default is refused";

/// The flags every program accepts: glog's logging flags (mapped onto our
/// logger or ignored) and the gflags built-ins.
#[rustfmt::skip]
pub static COMMON_FLAGS: &[FlagDef] = &[
    // ---- glog flags mapped to our logger ----
    f("v", Int32, "0", Log, "verbose logging (>0 = debug, >1 = trace)"),
    f("logtostderr", Bool, "false", Log, "log everything (from --minloglevel) to stderr"),
    f("alsologtostderr", Bool, "false", Log, "same as --logtostderr (we only log to stderr)"),
    f("minloglevel", Int32, "0", Log, "0=INFO 1=WARNING 2=ERROR 3=FATAL"),
    f("stderrthreshold", Int32, "2", Log, "severity copied to stderr"),
    f("log_dir", Str, "", Log, "also write every log line at --minloglevel and above to <log_dir>/<program>.INFO"),
    // ---- gflags / glog built-ins ----
    f("help", Bool, "false", Builtin, "show help on all flags and exit"),
    f("helpfull", Bool, "false", Builtin, "same as --help"),
    f("helpshort", Bool, "false", Builtin, "same as --help"),
    f("helppackage", Bool, "false", Builtin, "same as --help"),
    f("helpxml", Bool, "false", Builtin, "same as --help"),
    f("helpmatch", Str, "", Builtin, "show help on flags whose name contains this string"),
    f("helpon", Str, "", Builtin, "same as --helpmatch"),
    f("version", Bool, "false", Builtin, "show version and exit"),
    f("flagfile", Str, "", Builtin, "load flags from file (one per line)"),
    f("config_path", Str, "", Builtin, "JSON file of flag -> value; command-line flags override it"),
    f("fromenv", Str, "", Builtin, "comma-separated flags to read from FLAGS_<name> (must exist)"),
    f("tryfromenv", Str, "", Builtin, "comma-separated flags to read from FLAGS_<name> if set"),
    f("undefok", Str, "", Builtin, "comma-separated flag names that may be unknown"),
    f("tab_completion_columns", Int32, "80", Unsupported, IGN),
    f("tab_completion_word", Str, "", Unsupported, IGN),
    f("alsologtoemail", Str, "", Unsupported, IGN),
    f("colorlogtostderr", Bool, "false", Unsupported, IGN),
    f("drop_log_memory", Bool, "true", Unsupported, IGN),
    f("log_backtrace_at", Str, "", Unsupported, IGN),
    f("log_link", Str, "", Unsupported, IGN),
    f("log_prefix", Bool, "true", Unsupported, IGN),
    f("logbuflevel", Int32, "0", Unsupported, IGN),
    f("logbufsecs", Int32, "30", Unsupported, IGN),
    f("logemaillevel", Int32, "999", Unsupported, IGN),
    f("logfile_mode", Int32, "436", Unsupported, IGN),
    f("logmailer", Str, "/bin/mail", Unsupported, IGN),
    f("max_log_size", Int32, "1800", Unsupported, IGN),
    f("stop_logging_if_full_disk", Bool, "false", Unsupported, IGN),
    f("symbolize_stacktrace", Bool, "true", Unsupported, IGN),
    f("vmodule", Str, "", Unsupported, IGN),
];

/// A program's command line: its name, the title `--help` prints, and its
/// own flag table (searched before [`COMMON_FLAGS`]).
#[derive(Debug)]
pub struct Program {
    /// Binary name (`mooncake_master`), used by `--help` and `--version`.
    pub name: &'static str,
    /// What the program is, for the first line of `--help`.
    pub title: &'static str,
    /// The program's own flags.
    pub flags: &'static [FlagDef],
}

impl Program {
    /// Look a flag up by exact name: the program's table, then the common one.
    pub fn find(&self, name: &str) -> Option<&'static FlagDef> {
        self.flags
            .iter()
            .chain(COMMON_FLAGS.iter())
            .find(|d| d.name == name)
    }

    /// Every flag the program accepts, its own first.
    pub fn all(&self) -> impl Iterator<Item = &'static FlagDef> {
        self.flags.iter().chain(COMMON_FLAGS.iter())
    }

    /// What is wrong with the flags the program accepts: a name defined
    /// twice, or a default its own type refuses. Empty for a sound table.
    pub fn table_errors(&self) -> Vec<String> {
        let mut seen = HashSet::new();
        let mut errors = Vec::new();
        for d in self.all() {
            if !seen.insert(d.name) {
                errors.push(format!("duplicate flag {}", d.name));
            }
            if parse_value(d, d.default).is_err() {
                errors.push(format!("bad default for {}", d.name));
            }
        }
        errors
    }

    /// Text printed by `--help` (optionally only flags whose name contains `filter`).
    pub fn help_text(&self, filter: &str) -> String {
        let mut s = format!(
            "{}: {}, version {}\n\n  Flags:\n",
            self.name,
            self.title,
            env!("CARGO_PKG_VERSION")
        );
        for d in self.all().filter(|d| d.name.contains(filter)) {
            let help = match d.role {
                Feature(feat) => format!("requires {feat}, which this build does not implement"),
                Replaced(why) => format!("refused when true: {why}"),
                _ => d.help.to_string(),
            };
            s.push_str(&format!(
                "    -{} ({}) type: {} default: \"{}\"\n",
                d.name,
                help,
                d.ty.name(),
                d.default
            ));
        }
        s.trim_end().to_string()
    }

    /// Text printed by `--version`.
    pub fn version_text(&self) -> String {
        format!("{} version {}", self.name, env!("CARGO_PKG_VERSION"))
    }

    /// Parse `args` (`args[0]` is the program name). Warnings (ignored or
    /// deprecated flags, …) are returned for the caller to log once its
    /// logger is set up.
    pub fn parse(&'static self, args: &[String]) -> (Parsed, Vec<String>) {
        let mut warnings = Vec::new();
        let exit_err = |errors: Vec<String>| Parsed::Exit {
            code: 1,
            message: errors.join("\n"),
        };

        let mut scan = Scan {
            program: self,
            settings: Vec::new(),
            errors: Vec::new(),
            unknown: Vec::new(),
            undefok: HashSet::new(),
            config_path: None,
            help: None,
            version: false,
        };
        scan.scan_args(args.get(1..).unwrap_or(&[]), 0);
        for name in std::mem::take(&mut scan.unknown) {
            let base = name.strip_prefix("no").unwrap_or(&name);
            if !scan.undefok.contains(&name) && !scan.undefok.contains(base) {
                scan.errors
                    .push(format!("ERROR: unknown command line flag '{name}'"));
            }
        }
        let mut errors = std::mem::take(&mut scan.errors);

        let mut merged: HashMap<&'static str, Setting> = HashMap::new();
        if let Some(path) = &scan.config_path {
            for s in self.load_config_json(path, &mut errors, &mut warnings) {
                merged.insert(s.def.name, s);
            }
        }
        for s in std::mem::take(&mut scan.settings) {
            merged.insert(s.def.name, s);
        }
        if !errors.is_empty() {
            return (exit_err(errors), warnings);
        }
        if let Some(filter) = &scan.help {
            let message = self.help_text(filter);
            return (Parsed::Exit { code: 1, message }, warnings);
        }
        if scan.version {
            let message = self.version_text();
            return (Parsed::Exit { code: 0, message }, warnings);
        }

        let flags = Flags {
            program: self,
            set: merged,
        };
        // Feature switches and unimplemented flags set to anything but their
        // default fail fast.
        for def in self.all() {
            let Some(s) = flags.set.get(def.name) else {
                continue;
            };
            match def.role {
                Feature(feature)
                    if parse_value(def, def.default).ok().as_ref() != Some(&s.value) =>
                {
                    errors.push(format!(
                        "ERROR: flag --{} requires {feature}, which this build does not implement",
                        def.name
                    ));
                }
                Replaced(why) if s.value == Value::Bool(true) => {
                    errors.push(format!("ERROR: flag --{}: {why}", def.name));
                }
                Unsupported if parse_value(def, def.default).ok().as_ref() != Some(&s.value) => {
                    let origin = match s.source {
                        Source::CommandLine => "",
                        Source::ConfigFile => " (from config file)",
                    };
                    errors.push(format!(
                        "ERROR: flag --{}={}{origin} is not implemented by this build \
                         (only its default \"{}\" is accepted)",
                        def.name, s.raw, def.default
                    ));
                }
                _ => {}
            }
        }
        if !errors.is_empty() {
            return (exit_err(errors), warnings);
        }
        (Parsed::Run(flags), warnings)
    }

    /// Load `--config_path`: a flat JSON object of flag name → value.
    fn load_config_json(
        &'static self,
        path: &str,
        errors: &mut Vec<String>,
        warnings: &mut Vec<String>,
    ) -> Vec<Setting> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) => {
                errors.push(format!("ERROR: unable to read config file '{path}': {e}"));
                return Vec::new();
            }
        };
        let obj = match serde_json::from_str::<JsonValue>(&text) {
            Ok(JsonValue::Object(m)) => m,
            Ok(_) => {
                errors.push(format!(
                    "ERROR: config file '{path}' must hold a JSON object"
                ));
                return Vec::new();
            }
            Err(e) => {
                errors.push(format!(
                    "ERROR: config file '{path}' is not valid JSON: {e}"
                ));
                return Vec::new();
            }
        };
        let mut out = Vec::new();
        for (key, val) in obj {
            let Some(def) = self.find(&key) else {
                warnings.push(format!("config file '{path}': unknown key '{key}' ignored"));
                continue;
            };
            if def.role == Builtin {
                warnings.push(format!(
                    "config file '{path}': key '{key}' is only valid on the command line; ignored"
                ));
                continue;
            }
            let raw = match &val {
                JsonValue::String(s) => s.clone(),
                JsonValue::Bool(b) => b.to_string(),
                JsonValue::Number(n) => n.to_string(),
                other => {
                    errors.push(illegal(def, &other.to_string()));
                    continue;
                }
            };
            match parse_value(def, &raw) {
                Ok(value) => out.push(Setting {
                    def,
                    value,
                    raw,
                    source: Source::ConfigFile,
                }),
                Err(e) => errors.push(format!("{e} (in config file '{path}')")),
            }
        }
        out
    }
}

use serde_json::Value as JsonValue;

/// Result of parsing a command line.
#[derive(Debug)]
pub enum Parsed {
    /// Run with these flag values.
    Run(Flags),
    /// Exit immediately. Messages starting with `ERROR` belong on stderr;
    /// anything else (help, version) belongs on stdout.
    Exit {
        /// Process exit status.
        code: i32,
        /// Text to print (without trailing newline).
        message: String,
    },
}

/// A parsed flag value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A `bool` flag.
    Bool(bool),
    /// A signed integer flag.
    Int(i64),
    /// An unsigned integer (or duration, in ms) flag.
    UInt(u64),
    /// A `double` flag.
    Double(f64),
    /// A `string` flag.
    Str(String),
}

fn illegal(def: &FlagDef, raw: &str) -> String {
    format!(
        "ERROR: illegal value '{raw}' specified for {} flag '{}'",
        def.ty.name(),
        def.name
    )
}

/// gflags' message for a value its validator refused.
pub fn failed_validation(name: &str, raw: &str) -> String {
    format!("ERROR: failed validation of new value '{raw}' for flag '{name}'")
}

fn parse_bool(raw: &str) -> Option<bool> {
    match raw.to_ascii_lowercase().as_str() {
        "true" | "t" | "yes" | "y" | "1" => Some(true),
        "false" | "f" | "no" | "n" | "0" => Some(false),
        _ => None,
    }
}

/// strtol-like: optional sign, decimal or `0x` hex, nothing else.
fn parse_signed(raw: &str) -> Option<i128> {
    let (neg, rest) = match raw.as_bytes().first() {
        Some(b'-') => (true, &raw[1..]),
        Some(b'+') => (false, &raw[1..]),
        _ => (false, raw),
    };
    if rest.is_empty() || rest.starts_with(['+', '-']) {
        return None;
    }
    let mag = if let Some(hex) = rest.strip_prefix("0x").or_else(|| rest.strip_prefix("0X")) {
        i128::from_str_radix(hex, 16).ok()?
    } else {
        rest.parse::<i128>().ok()?
    };
    Some(if neg { -mag } else { mag })
}

/// Parse a duration: non-negative integer with optional `ms`/`s`/`m`/`h`; result in ms.
pub fn parse_duration_ms(raw: &str) -> Option<u64> {
    let (digits, mult) = if let Some(d) = raw.strip_suffix("ms") {
        (d, 1)
    } else if let Some(d) = raw.strip_suffix('s') {
        (d, 1_000)
    } else if let Some(d) = raw.strip_suffix('m') {
        (d, 60_000)
    } else if let Some(d) = raw.strip_suffix('h') {
        (d, 3_600_000)
    } else {
        (raw, 1)
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u64>().ok()?.checked_mul(mult)
}

/// Parse `raw` as a value of `def`'s type, or gflags' error message.
pub fn parse_value(def: &FlagDef, raw: &str) -> Result<Value, String> {
    let int_in = |lo: i128, hi: i128| -> Result<i128, String> {
        match parse_signed(raw) {
            Some(v) if v >= lo && v <= hi => Ok(v),
            _ => Err(illegal(def, raw)),
        }
    };
    Ok(match def.ty {
        FlagType::Bool => Value::Bool(parse_bool(raw).ok_or_else(|| illegal(def, raw))?),
        FlagType::Int32 => Value::Int(int_in(i32::MIN.into(), i32::MAX.into())? as i64),
        FlagType::Int64 => Value::Int(int_in(i64::MIN.into(), i64::MAX.into())? as i64),
        FlagType::Uint32 if raw.starts_with('-') => return Err(illegal(def, raw)),
        FlagType::Uint32 => Value::UInt(int_in(0, u32::MAX.into())? as u64),
        FlagType::Uint64 if raw.starts_with('-') => return Err(illegal(def, raw)),
        FlagType::Uint64 => Value::UInt(int_in(0, u64::MAX.into())? as u64),
        FlagType::Double => match raw.trim().parse::<f64>() {
            Ok(v) if !v.is_nan() && !raw.trim().is_empty() => Value::Double(v),
            _ => return Err(illegal(def, raw)),
        },
        FlagType::Str => Value::Str(raw.to_string()),
        FlagType::Duration => {
            Value::UInt(parse_duration_ms(raw).ok_or_else(|| failed_validation(def.name, raw))?)
        }
    })
}

/// Where a setting came from (command line / flagfile / env, or the JSON config).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    CommandLine,
    ConfigFile,
}

#[derive(Debug, Clone)]
struct Setting {
    def: &'static FlagDef,
    value: Value,
    raw: String,
    source: Source,
}

/// Accumulates everything found while scanning arguments.
struct Scan {
    program: &'static Program,
    settings: Vec<Setting>,
    errors: Vec<String>,
    unknown: Vec<String>,
    undefok: HashSet<String>,
    config_path: Option<String>,
    help: Option<String>,
    version: bool,
}

const MAX_FLAGFILE_DEPTH: usize = 16;

impl Scan {
    /// Scan argv-style tokens. Returns after `--` or the end.
    fn scan_args(&mut self, args: &[String], depth: usize) {
        let mut i = 0;
        while i < args.len() {
            let arg = &args[i];
            i += 1;
            if arg == "--" {
                break;
            }
            let body = match arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) {
                Some(b) if !b.is_empty() => b,
                _ => continue, // positional (or a lone "-"): ignored
            };
            let (name, inline) = match body.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (body, None),
            };
            if let Some(def) = self.program.find(name) {
                let raw = match inline {
                    Some(v) => v,
                    None if def.ty == FlagType::Bool => "true".to_string(),
                    None => {
                        if i < args.len() {
                            i += 1;
                            args[i - 1].clone()
                        } else {
                            self.errors
                                .push(format!("ERROR: flag '{name}' is missing its argument"));
                            continue;
                        }
                    }
                };
                self.set(def, &raw, depth);
            } else if let Some(def) = name.strip_prefix("no").and_then(|n| self.program.find(n)) {
                if inline.is_some() {
                    self.unknown.push(name.to_string());
                } else if def.ty == FlagType::Bool {
                    self.set(def, "false", depth);
                } else {
                    self.errors.push(format!(
                        "ERROR: boolean value ({name}) specified for {} command line flag '{}'",
                        def.ty.name(),
                        def.name
                    ));
                }
            } else {
                self.unknown.push(name.to_string());
            }
        }
    }

    /// Record one command-line assignment (handling built-ins immediately).
    fn set(&mut self, def: &'static FlagDef, raw: &str, depth: usize) {
        let value = match parse_value(def, raw) {
            Ok(v) => v,
            Err(e) => {
                self.errors.push(e);
                return;
            }
        };
        if def.role == Builtin {
            self.builtin(def.name, &value, depth);
            return;
        }
        self.settings.push(Setting {
            def,
            value,
            raw: raw.to_string(),
            source: Source::CommandLine,
        });
    }

    fn builtin(&mut self, name: &str, value: &Value, depth: usize) {
        match (name, value) {
            ("help" | "helpfull" | "helpshort" | "helppackage" | "helpxml", Value::Bool(b)) => {
                if *b {
                    self.help = Some(String::new());
                } else if name == "help" {
                    self.help = None;
                }
            }
            ("helpmatch" | "helpon", Value::Str(s)) if !s.is_empty() => {
                self.help = Some(s.clone());
            }
            ("version", Value::Bool(b)) => self.version = *b,
            ("flagfile", Value::Str(path)) if !path.is_empty() => {
                for p in path.split(',').filter(|p| !p.is_empty()) {
                    self.flagfile(p, depth);
                }
            }
            ("config_path", Value::Str(path)) => {
                self.config_path = (!path.is_empty()).then(|| path.clone());
            }
            ("undefok", Value::Str(list)) => {
                self.undefok
                    .extend(list.split(',').map(str::trim).map(String::from));
            }
            ("fromenv" | "tryfromenv", Value::Str(list)) => {
                let required = name == "fromenv";
                for flag in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                    let Some(def) = self.program.find(flag) else {
                        self.errors.push(format!(
                            "ERROR: unknown command line flag '{flag}' (via --{name})"
                        ));
                        continue;
                    };
                    match std::env::var(format!("FLAGS_{flag}")) {
                        Ok(v) => self.set(def, &v, depth + 1),
                        Err(_) if required => self
                            .errors
                            .push(format!("ERROR: FLAGS_{flag} not found in environment")),
                        Err(_) => {}
                    }
                }
            }
            _ => {}
        }
    }

    fn flagfile(&mut self, path: &str, depth: usize) {
        if depth >= MAX_FLAGFILE_DEPTH {
            self.errors
                .push(format!("ERROR: flagfile '{path}' nested too deeply"));
            return;
        }
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) => {
                self.errors
                    .push(format!("ERROR: unable to open flagfile '{path}': {e}"));
                return;
            }
        };
        let mut tokens = Vec::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') || !line.starts_with('-') {
                continue;
            }
            // `--name=value` keeps the whole rest of the line as the value;
            // `--name value` is accepted too.
            match (line.find('='), line.find(char::is_whitespace)) {
                (None, Some(ws)) => {
                    tokens.push(line[..ws].to_string());
                    tokens.push(line[ws..].trim().to_string());
                }
                (Some(eq), Some(ws)) if ws < eq => {
                    tokens.push(line[..ws].to_string());
                    tokens.push(line[ws..].trim().to_string());
                }
                _ => tokens.push(line.to_string()),
            }
        }
        self.scan_args(&tokens, depth + 1);
    }
}

/// Merged view of the final flag values (defaults + config file + command line).
#[derive(Debug)]
pub struct Flags {
    program: &'static Program,
    set: HashMap<&'static str, Setting>,
}

impl Flags {
    /// The value of `name`: as set, else its default.
    pub fn value(&self, name: &str) -> Value {
        if let Some(s) = self.set.get(name) {
            return s.value.clone();
        }
        match self.program.find(name).map(|d| parse_value(d, d.default)) {
            Some(Ok(v)) => v,
            _ => {
                debug_assert!(false, "flag table default for '{name}' is invalid");
                Value::Str(String::new())
            }
        }
    }

    /// Whether `name` was given (command line, flagfile, env or config file).
    pub fn is_set(&self, name: &str) -> bool {
        self.set.contains_key(name)
    }

    /// The text `name` was given as, else its default's.
    pub fn raw(&self, name: &str) -> String {
        match (self.set.get(name), self.program.find(name)) {
            (Some(s), _) => s.raw.clone(),
            (None, Some(d)) => d.default.to_string(),
            _ => String::new(),
        }
    }

    /// A `bool` flag.
    pub fn bool(&self, name: &str) -> bool {
        matches!(self.value(name), Value::Bool(true))
    }

    /// A signed integer flag.
    pub fn int(&self, name: &str) -> i64 {
        match self.value(name) {
            Value::Int(v) => v,
            Value::UInt(v) => v.min(i64::MAX as u64) as i64,
            _ => 0,
        }
    }

    /// An unsigned integer (or duration) flag.
    pub fn uint(&self, name: &str) -> u64 {
        match self.value(name) {
            Value::UInt(v) => v,
            Value::Int(v) => v.max(0) as u64,
            _ => 0,
        }
    }

    /// A `double` flag.
    pub fn double(&self, name: &str) -> f64 {
        match self.value(name) {
            Value::Double(v) => v,
            _ => 0.0,
        }
    }

    /// A `string` flag.
    pub fn string(&self, name: &str) -> String {
        match self.value(name) {
            Value::Str(v) => v,
            _ => String::new(),
        }
    }

    /// Integer flag constrained to `lo..=hi`, else a validation error.
    pub fn int_range(&self, name: &str, lo: i64, hi: i64) -> Result<i64, String> {
        let v = self.int(name);
        if (lo..=hi).contains(&v) {
            Ok(v)
        } else {
            Err(failed_validation(name, &self.raw(name)))
        }
    }

    /// Map the glog flags onto a `tracing` level. Without any log flag: `warn`.
    pub fn log_level(&self, warnings: &mut Vec<String>) -> String {
        const NAMES: [&str; 3] = ["info", "warn", "error"];
        let sev = |v: i64| NAMES[v.clamp(0, 2) as usize];
        let min = self.int("minloglevel");
        let mut level = if self.bool("logtostderr") || self.bool("alsologtostderr") {
            sev(min)
        } else if self.is_set("stderrthreshold") {
            sev(self.int("stderrthreshold").max(min))
        } else if self.is_set("minloglevel") {
            sev(min.max(1))
        } else {
            "warn"
        };
        if min >= 3 {
            level = "off";
        }
        let v = self.int("v");
        if v >= 2 {
            level = "trace";
        } else if v == 1 {
            level = "debug";
        }
        let _ = warnings;
        level.to_string()
    }

    /// `--log_dir`, as glog uses it: every line at `--minloglevel` and above
    /// (or the `--v` level) also goes to `<log_dir>/<program>.INFO`.
    pub fn log_file(&self) -> Option<LogFile> {
        let dir = self.string("log_dir");
        if dir.is_empty() {
            return None;
        }
        const NAMES: [&str; 4] = ["info", "warn", "error", "off"];
        let v = self.int("v");
        let level = if v >= 2 {
            "trace"
        } else if v == 1 {
            "debug"
        } else {
            NAMES[self.int("minloglevel").clamp(0, 3) as usize]
        };
        Some(LogFile {
            path: std::path::Path::new(&dir).join(format!("{}.INFO", self.program.name)),
            level: level.to_string(),
        })
    }
}

/// The file a binary logs to besides stderr (`--log_dir`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogFile {
    /// `<log_dir>/<program>.INFO`, appended to.
    pub path: std::path::PathBuf,
    /// The filter of the lines written there.
    pub level: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use FlagRole::Core;
    use FlagType::Uint64;

    static DEMO: Program = Program {
        name: "demo",
        title: "a test program",
        flags: &[
            f("port", Int32, "50052", Core, "a port"),
            f("size", Str, "4 GB", Core, "a size"),
            f("big", Uint64, "0", Core, "a count"),
            f("on", Bool, "true", Core, "a switch"),
            f("later", Bool, "false", Feature("a later feature"), "later"),
            f("later_dir", Str, "", Feature("a later feature"), "later"),
            f("old", Int32, "0", Unsupported, IGN),
        ],
    };

    fn parse(list: &[&str]) -> (Parsed, Vec<String>) {
        let args: Vec<String> = std::iter::once("demo")
            .chain(list.iter().copied())
            .map(String::from)
            .collect();
        DEMO.parse(&args)
    }

    fn run(list: &[&str]) -> Flags {
        match parse(list).0 {
            Parsed::Run(f) => f,
            Parsed::Exit { code, message } => panic!("exit {code}: {message}"),
        }
    }

    fn exit(list: &[&str]) -> (i32, String) {
        match parse(list).0 {
            Parsed::Exit { code, message } => (code, message),
            Parsed::Run(_) => panic!("unexpectedly ran"),
        }
    }

    #[test]
    fn tables_are_consistent() {
        assert_eq!(DEMO.table_errors(), Vec::<String>::new());
    }

    #[test]
    fn a_program_table_and_the_common_flags() {
        let fl = run(&["--port=7", "-size", "1 GB", "--noon", "--v=1"]);
        assert_eq!(fl.int("port"), 7);
        assert_eq!(fl.string("size"), "1 GB");
        assert!(!fl.bool("on"));
        assert_eq!(fl.log_level(&mut Vec::new()), "debug");
        let fl = run(&[]);
        assert_eq!(fl.int("port"), 50052);
        assert_eq!(fl.string("size"), "4 GB");
        assert!(fl.bool("on"));
        assert_eq!(fl.log_level(&mut Vec::new()), "warn");
    }

    #[test]
    fn errors_are_gflags_messages() {
        assert_eq!(
            exit(&["--bogus=1"]),
            (1, "ERROR: unknown command line flag 'bogus'".to_string())
        );
        assert_eq!(
            exit(&["--port=x"]),
            (
                1,
                "ERROR: illegal value 'x' specified for int32 flag 'port'".to_string()
            )
        );
        assert_eq!(
            exit(&["--big=-1"]),
            (
                1,
                "ERROR: illegal value '-1' specified for uint64 flag 'big'".to_string()
            )
        );
        assert_eq!(
            exit(&["--port"]),
            (1, "ERROR: flag 'port' is missing its argument".to_string())
        );
        let (code, msg) = exit(&["--later"]);
        assert_eq!(code, 1);
        assert!(msg.contains("requires a later feature"), "{msg}");
        // A feature's setting fails on any value but its default.
        let (code, msg) = exit(&["--later_dir=/x"]);
        assert_eq!(code, 1);
        assert!(
            msg.contains("flag --later_dir requires a later feature"),
            "{msg}"
        );
        assert!(matches!(parse(&["--later_dir="]).0, Parsed::Run(_)));
        assert!(matches!(
            parse(&["--bogus=1", "--undefok=bogus"]).0,
            Parsed::Run(_)
        ));
    }

    #[test]
    fn unsupported_flags_are_refused_unless_default() {
        let (p, w) = parse(&["--old=0"]);
        assert!(matches!(p, Parsed::Run(_)));
        assert!(w.is_empty(), "{w:?}");
        let (code, msg) = exit(&["--old=3"]);
        assert_eq!(code, 1);
        assert!(
            msg.contains("flag --old=3 is not implemented by this build"),
            "{msg}"
        );
        assert!(msg.contains("only its default \"0\""), "{msg}");
    }

    #[test]
    fn help_and_version_name_the_program() {
        let (code, msg) = exit(&["--help"]);
        assert_eq!(code, 1);
        assert!(msg.starts_with("demo: a test program, version"), "{msg}");
        assert!(msg.contains("-port (a port) type: int32 default: \"50052\""));
        let (code, msg) = exit(&["--version"]);
        assert_eq!(code, 0);
        assert!(msg.starts_with("demo version "));
    }
}
