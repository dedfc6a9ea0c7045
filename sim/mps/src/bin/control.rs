//! Stand-in `nvidia-cuda-mps-control`: `-d` starts the daemon, otherwise
//! client mode sends each stdin line to the daemon and prints the answer.
//! See the crate docs for what is simulated.

use mps_sim::{log, pipe_dir, Behaviour, QuitBehaviour, PID_FILE, SOCKET};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::{Child, Command, Stdio};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = match args.first().map(String::as_str) {
        Some("-d") => daemon_mode(),
        None => client_mode(),
        Some(other) => {
            eprintln!("nvidia-cuda-mps-control: unknown option {other}");
            1
        }
    };
    std::process::exit(code);
}

fn client_mode() -> i32 {
    let socket = pipe_dir().join(SOCKET);
    let stdin = std::io::stdin();
    for line in stdin.lock().lines().map_while(Result::ok) {
        let cmd = line.trim();
        if cmd.is_empty() {
            continue;
        }
        let Ok(mut stream) = UnixStream::connect(&socket) else {
            eprintln!("Cannot find MPS control daemon process");
            return 1;
        };
        let _ = writeln!(stream, "{cmd}");
        let _ = stream.shutdown(std::net::Shutdown::Write);
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        print!("{answer}");
    }
    0
}

/// Forks like the real daemon: the foreground process exits 0 once the
/// daemon is listening.
fn daemon_mode() -> i32 {
    let behaviour = Behaviour::load();
    let pipe = pipe_dir();
    if let Some(pid) = std::fs::read_to_string(pipe.join(PID_FILE)).ok().and_then(|t| t.trim().parse::<i32>().ok()) {
        if unsafe { libc::kill(pid, 0) } == 0 {
            eprintln!("An instance of this daemon is already running");
            return 1;
        }
    }
    if std::fs::create_dir_all(&pipe).is_err() {
        eprintln!("Cannot create pipe directory {}", pipe.display());
        return 1;
    }
    let (ready_r, ready_w) = nix::unistd::pipe().expect("pipe");
    match unsafe { nix::unistd::fork() }.expect("fork") {
        nix::unistd::ForkResult::Parent { .. } => {
            drop(ready_w);
            let mut byte = [0u8; 1];
            let ok = std::fs::File::from(ready_r).read_exact(&mut byte).is_ok() && byte[0] == b'1';
            if ok { 0 } else { 1 }
        }
        nix::unistd::ForkResult::Child => {
            drop(ready_r);
            let ready: std::fs::File = ready_w.into();
            if behaviour.unreaped {
                become_unreaped_child(&ready);
            }
            run_daemon(behaviour, ready)
        }
    }
}

/// Forks once more: the daemon continues in the grandchild, and this process
/// turns into `sleep`, which never reaps it. A killed daemon then stays
/// defunct until the sleep ends, as was seen on a real node.
fn become_unreaped_child(ready: &std::fs::File) {
    match unsafe { nix::unistd::fork() }.expect("fork") {
        nix::unistd::ForkResult::Child => {}
        nix::unistd::ForkResult::Parent { .. } => {
            // The readiness pipe is the daemon's to answer, not sleep's.
            unsafe { libc::close(std::os::unix::io::AsRawFd::as_raw_fd(ready)) };
            // Out of the starter's session: slurmd kills what a prolog leaves
            // in its own process group.
            let _ = nix::unistd::setsid();
            let err = std::os::unix::process::CommandExt::exec(Command::new("/bin/sleep").arg("30"));
            eprintln!("exec sleep: {err}");
            std::process::exit(1);
        }
    }
}

struct Daemon {
    behaviour: Behaviour,
    server: Option<Child>,
    thread_percentage: u32,
    pinned_mem: BTreeMap<String, String>,
}

fn run_daemon(behaviour: Behaviour, mut ready: std::fs::File) -> i32 {
    let _ = nix::unistd::setsid();
    if behaviour.on_sigterm == QuitBehaviour::Ignore {
        unsafe { libc::signal(libc::SIGTERM, libc::SIG_IGN) };
    }
    let pipe = pipe_dir();
    let socket = pipe.join(SOCKET);
    let _ = std::fs::remove_file(&socket);
    let listener = match UnixListener::bind(&socket) {
        Ok(l) => l,
        Err(e) => {
            log("control.log", &format!("cannot bind {}: {e}", socket.display()));
            let _ = ready.write_all(b"0");
            return 1;
        }
    };
    let _ = std::fs::write(pipe.join(PID_FILE), format!("{}\n", std::process::id()));
    log("control.log", &format!("Starting control daemon pid {} uid {}", std::process::id(), unsafe { libc::getuid() }));
    let mut d = Daemon { behaviour, server: start_server(), thread_percentage: 100, pinned_mem: BTreeMap::new() };
    let _ = ready.write_all(b"1");
    drop(ready);
    for stream in listener.incoming().flatten() {
        if d.serve(stream) {
            break;
        }
    }
    let _ = std::fs::remove_file(&socket);
    let _ = std::fs::remove_file(pipe.join(PID_FILE));
    log("control.log", "control daemon exiting");
    0
}

fn start_server() -> Option<Child> {
    Command::new(mps_sim::sibling("nvidia-cuda-mps-server")).stdin(Stdio::null()).spawn().ok()
}

impl Daemon {
    /// Answers one connection's command; true when the daemon must exit.
    fn serve(&mut self, stream: UnixStream) -> bool {
        let mut line = String::new();
        let _ = BufReader::new(&stream).read_line(&mut line);
        let words: Vec<&str> = line.split_whitespace().collect();
        log("control.log", &format!("command: {}", words.join(" ")));
        let (answer, exit) = self.command(&words);
        let mut stream = stream;
        let _ = stream.write_all(answer.as_bytes());
        exit
    }

    fn command(&mut self, words: &[&str]) -> (String, bool) {
        match words {
            ["get_server_list"] => (self.server_pid().map(|p| format!("{p}\n")).unwrap_or_default(), false),
            ["ps"] => ("PID ID SERVER DEVICE NAMESPACE COMMAND\n".into(), false),
            ["set_default_active_thread_percentage", p] => match p.parse::<u32>() {
                Ok(v) if (1..=100).contains(&v) => {
                    self.thread_percentage = v;
                    (format!("{v}.0\n"), false)
                }
                _ => ("Invalid percentage\n".into(), false),
            },
            ["get_default_active_thread_percentage"] => (format!("{}.0\n", self.thread_percentage), false),
            ["set_default_device_pinned_mem_limit", dev, limit] => {
                self.pinned_mem.insert(dev.to_string(), limit.to_string());
                (String::new(), false)
            }
            ["get_default_device_pinned_mem_limit", dev] => {
                (format!("{}\n", self.pinned_mem.get(*dev).map(String::as_str).unwrap_or("0")), false)
            }
            ["shutdown_server", ..] => {
                self.stop_server();
                (String::new(), false)
            }
            ["quit"] if self.behaviour.quit == QuitBehaviour::Ignore => {
                log("control.log", "quit ignored (mps-sim.toml: quit = \"ignore\")");
                (String::new(), false)
            }
            ["quit"] => {
                self.stop_server();
                (String::new(), true)
            }
            _ => ("Unknown command\n".into(), false),
        }
    }

    fn server_pid(&mut self) -> Option<u32> {
        let alive = self.server.as_mut().map(|c| matches!(c.try_wait(), Ok(None))).unwrap_or(false);
        alive.then(|| self.server.as_ref().unwrap().id())
    }

    fn stop_server(&mut self) {
        if let Some(mut s) = self.server.take() {
            unsafe { libc::kill(s.id() as i32, libc::SIGTERM) };
            let _ = s.wait();
        }
    }
}
