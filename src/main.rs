//! The `satellite` binary: parse the command line, run, exit with a clear code.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use secrecy::ExposeSecret;

use satellite::app::{self, Satellite};
use satellite::config::{self, env, Config, Flags, LogFormat, Mode, StandaloneSource};
use satellite::demo::{self, DemoServer, ProtocolSupport};
use satellite::telemetry;

/// mimalloc, not glibc's malloc: under load glibc spent a fifth of the satellite's CPU in malloc/free
/// (`malloc_consolidate`, `unlink_chunk`); see [`tune_allocator`] for its memory settings.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's defaults keep freed memory for a while and commit arenas eagerly, so a purge only marks pages
/// free (they stay in RSS until the kernel needs them): the embedded default held 110 MiB once started and
/// 62 MiB idle (glibc: 73 / 27). Committing on demand gives 62 / 33 MiB (docs/performance-history.md). Freed pages go
/// back to the OS 10 ms after they are freed, not at once: returning them at once made every burst of calls
/// fault them in again (page faults, zeroing, TLB shootdowns), 7% of a proxied call's CPU, while 10 ms costs
/// about 2 MiB under load and nothing idle. The options must be set before mimalloc reserves its first
/// arena, which happens before `main`: hence a constructor (ELF targets; elsewhere mimalloc's defaults stay).
/// `MIMALLOC_ARENA_EAGER_COMMIT` and `MIMALLOC_PURGE_DELAY`, spelled so, still win.
#[cfg(target_os = "linux")]
#[used]
#[link_section = ".init_array"]
static TUNE_ALLOCATOR: extern "C" fn() = tune_allocator;

#[cfg(target_os = "linux")]
extern "C" fn tune_allocator() {
    for (option, variable, value) in satellite::memory::ALLOCATOR_OPTIONS {
        if std::env::var_os(variable).is_none() {
            // SAFETY: mi_option_set only stores the value in mimalloc's option table; any option index below
            // _mi_option_last is valid.
            unsafe { libmimalloc_sys::mi_option_set(option, value) };
        }
    }
}

#[path = "main/commands.rs"]
mod commands;
use commands::{check_config, import, search, token_new, tokens};
#[path = "main/serve.rs"]
mod serve;
use serve::{serve, shutdown_signal};

#[derive(Parser)]
#[command(name = "satellite", version, about = "An MCP gateway for teams", propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the satellite (standalone with the embedded default when no config is given).
    Serve(ServeArgs),
    /// Validate the configuration exactly as `serve` would (sandbox policy included) and print it with secrets
    /// redacted; exit 64 with one line per problem when `serve` would refuse something.
    CheckConfig(ServeArgs),
    /// Make tokens: a bearer token for a user, or an instance token (`ds_inst_…`), with the hash to paste.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Search tools as `discover_mcp_tools` would: on a running satellite (--url, --token) or in the catalogs
    /// stored in the data directory.
    Search(SearchArgs),
    /// The config file's JSON Schema, for editors.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Turn a client's MCP server list (Claude Desktop, Claude Code, Cursor `mcpServers`, VS Code `servers`)
    /// into a standalone config file.
    Import(ImportArgs),
    /// Shell completions, e.g. `satellite completions bash > /etc/bash_completion.d/satellite`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the version.
    Version,
    /// Run the bundled demo MCP server (stdio unless --http is given).
    DemoServer(DemoArgs),
    /// Count each tool's tokens of MCP servers and what the hierarchical router would save.
    ///
    /// Examples: `satellite tokens -- npx -y @modelcontextprotocol/server-everything stdio`,
    /// `satellite tokens --url https://mcp.example.com/mcp --header "Authorization: Bearer …"`,
    /// `satellite tokens --config satellite.toml --json`.
    Tokens(TokensArgs),
    /// Internal: the process-tree watchdog `serve` starts (kills MCP servers' process groups if it dies).
    #[command(hide = true)]
    Reaper,
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Standalone config file (TOML); env SATELLITE_CONFIG.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Listen port; env PORT.
    #[arg(long)]
    port: Option<u16>,
    /// Listen address; env HOST.
    #[arg(long)]
    host: Option<IpAddr>,
    /// Data directory (SQLite); env SATELLITE_DATA_DIR.
    #[arg(long)]
    data_dir: Option<PathBuf>,
}

impl ServeArgs {
    fn flags(&self) -> Flags {
        Flags { config: self.config.clone(), host: self.host, port: self.port, data_dir: self.data_dir.clone() }
    }
}

#[derive(Subcommand)]
enum TokenCommand {
    /// A new random token and its SHA-256, to paste into the config file.
    New {
        /// An instance token (`ds_inst_` + 64 hex) for `instance_token_sha256` instead of a user token.
        #[arg(long)]
        instance: bool,
        /// Print JSON (`token`, `sha256`, `kind`).
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Print the JSON Schema of the standalone config file (TOML), e.g. for taplo or VS Code's Even Better TOML.
    Schema,
}

#[derive(clap::Args)]
struct SearchArgs {
    /// What to look for, as an agent would ask.
    query: String,
    /// A running satellite's MCP endpoint, e.g. http://127.0.0.1:3001/mcp.
    #[arg(long, requires = "token")]
    url: Option<url::Url>,
    /// The bearer token to search as (with --url); env SATELLITE_TOKEN.
    #[arg(long, env = "SATELLITE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Stored catalogs only: one user's instances.
    #[arg(long, conflicts_with = "url")]
    user: Option<String>,
    /// How many tools to show.
    #[arg(long, default_value_t = 10)]
    limit: usize,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(clap::Args)]
struct ImportArgs {
    /// The client's JSON file (claude_desktop_config.json, .mcp.json, ~/.cursor/mcp.json, .vscode/mcp.json).
    file: PathBuf,
    /// Team id for the imported servers.
    #[arg(long, default_value = "team")]
    team: String,
    /// User id who gets an instance of each; a token is made for them and printed once on stderr.
    #[arg(long, default_value = "me")]
    user: String,
    /// Write the config here instead of stdout (refuses to overwrite).
    #[arg(long, short)]
    output: Option<PathBuf>,
}

#[derive(clap::Args)]
struct TokensArgs {
    /// A remote MCP server (Streamable HTTP, or legacy SSE with --sse).
    #[arg(long, conflicts_with_all = ["config", "command"])]
    url: Option<url::Url>,
    /// A header for --url, `Name: value` (repeatable).
    #[arg(long = "header", requires = "url")]
    headers: Vec<String>,
    /// --url speaks the legacy HTTP+SSE transport.
    #[arg(long, requires = "url")]
    sse: bool,
    /// Every enabled installation of this standalone config file, started as `serve` would (sandbox included).
    #[arg(long, conflicts_with = "command")]
    config: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Seconds to wait for each server's handshake and listing.
    #[arg(long, default_value_t = 60)]
    timeout: u64,
    /// A stdio MCP server: the command and its arguments, after `--`.
    #[arg(last = true)]
    command: Vec<String>,
}

#[derive(clap::Args)]
struct DemoArgs {
    /// Serve Streamable HTTP on this address instead of stdio.
    #[arg(long)]
    http: Option<SocketAddr>,
    /// Which protocol eras to accept.
    #[arg(long, value_enum, default_value = "both")]
    protocol: ProtocolSupport,
    /// Serve this tool corpus (JSON lines), one endpoint per server slug: /servers/{slug}/mcp. Needs --http.
    #[arg(long, requires = "http")]
    corpus: Option<PathBuf>,
    /// Split tools/list into pages of this size.
    #[arg(long)]
    page_size: Option<usize>,
    /// A label the `with_meta` tool returns in `_meta["demo/instance"]`, to tell instances apart.
    #[arg(long)]
    label: Option<String>,
    /// Leave out this demo tool (repeatable).
    #[arg(long = "without-tool")]
    without_tools: Vec<String>,
    /// Answer tools/list in a non-standard shape: `array` (a bare array), `functions`, or any other key.
    #[arg(long)]
    tools_shape: Option<String>,
    /// Never answer tools/list pages after this many (with --page-size): a server that stalls mid-listing.
    #[arg(long, requires = "page_size")]
    stall_after_page: Option<usize>,
    /// Answer tools/list with an error: a server that cannot list its tools.
    #[arg(long)]
    fail_tools_list: bool,
    /// Also list a tool nested deeper than a JSON parser follows: one entry a gateway cannot read.
    #[arg(long)]
    deep_tool: bool,
    /// Offer `toggle_tool`: hide or show a tool at run time and send notifications/tools/list_changed (stdio).
    #[arg(long)]
    mutable_tools: bool,
}

impl DemoArgs {
    fn server(&self) -> DemoServer {
        DemoServer::demo(self.protocol, self.page_size)
            .with_label(self.label.clone())
            .without_tools(&self.without_tools)
            .with_quirks(demo::Quirks {
                shape: self.tools_shape.clone(),
                stall_after_page: self.stall_after_page,
                fail_listing: self.fail_tools_list,
                deep_tool: self.deep_tool,
                mutable: self.mutable_tools,
            })
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Version => {
            println!("satellite {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Command::CheckConfig(args) => check_config(&args),
        Command::Token(TokenCommand::New { instance, json }) => token_new(instance, json),
        Command::Search(args) => search(&args),
        Command::Config(ConfigCommand::Schema) => {
            let mut schema =
                serde_json::to_value(schemars::schema_for!(satellite::config::file::RawFile)).unwrap_or_default();
            schema["title"] = "satellite standalone config file (TOML)".into();
            print_json(&schema)
        }
        Command::Import(args) => import(&args),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "satellite", &mut script);
            print_out(&String::from_utf8_lossy(&script))
        }
        Command::Serve(args) => serve(&args),
        Command::DemoServer(args) => demo_server(args),
        Command::Tokens(args) => tokens(&args),
        Command::Reaper => {
            satellite::mcp::transport::stdio::reaper::run(std::io::stdin().lock());
            ExitCode::SUCCESS
        }
    }
}

/// Write to stdout; a closed pipe (`satellite check-config | head`) ends the output quietly instead of a panic.
fn print_out(text: &str) -> ExitCode {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: cannot write the output: {err}");
            ExitCode::FAILURE
        }
    }
}

fn print_json(value: &serde_json::Value) -> ExitCode {
    match serde_json::to_string_pretty(value) {
        Ok(text) => print_out(&format!("{text}\n")),
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

fn exit(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

/// A runtime for a command; when none starts, the error is said and the exit code returned.
fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Runtime::new().map_err(|err| {
        eprintln!("error: cannot start the async runtime: {err}");
        ExitCode::FAILURE
    })
}

fn load(args: &ServeArgs) -> Result<(Config, HashMap<String, String>), ExitCode> {
    let env = env::from_process();
    match Config::load(&env, &args.flags()) {
        Ok(config) => Ok((config, env)),
        Err(err) => {
            eprintln!("error: {err}");
            Err(exit(config::EXIT_CONFIG))
        }
    }
}

fn demo_server(args: DemoArgs) -> ExitCode {
    let _logs = telemetry::init("warn", LogFormat::Pretty, false);
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    runtime.block_on(async move {
        let Some(addr) = args.http else {
            return match demo::stdio::serve(args.server()).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => {
                    eprintln!("error: {err}");
                    ExitCode::FAILURE
                }
            };
        };
        let servers = match &args.corpus {
            Some(path) => match demo::corpus::load(path) {
                Ok(corpus) => demo::corpus::servers(corpus, args.protocol),
                Err(err) => {
                    eprintln!("error: {err}");
                    return exit(config::EXIT_CONFIG);
                }
            },
            None => HashMap::from([(String::new(), args.server())]),
        };
        let listener = match demo::http::bind(addr).await {
            Ok(listener) => listener,
            Err(err) => {
                eprintln!("error: cannot listen on {addr}: {err}");
                return ExitCode::FAILURE;
            }
        };
        let bound = listener.local_addr().map(|a| a.to_string()).unwrap_or_else(|_| addr.to_string());
        // Tests and scripts read this line to learn the port.
        println!("demo server listening on http://{bound} ({} endpoint(s))", servers.len());
        demo::http::serve(listener, servers, shutdown_signal()).await;
        ExitCode::SUCCESS
    })
}
