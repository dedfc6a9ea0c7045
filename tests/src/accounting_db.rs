//! Slurm accounting against a real database for a harness cluster
//! ([`crate::ClusterSpec::accounting_db`]): a private MariaDB (data
//! directory, socket and pid file under `<cluster>/db`, TCP on 127.0.0.1 on
//! a free port) and slurmdbd with `accounting_storage/mysql`, so `sacct`
//! reads what slurmctld recorded. Nothing of the system's MariaDB is used:
//! the Debian package's own service stays stopped.
//!
//! slurmdbd 22.05 connects by host and port only (no socket option), so the
//! database listens on 127.0.0.1; `localhost` would make the client library
//! take the system's default socket instead.

use crate::{Cluster, SlurmInstall};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The database user slurmdbd logs in as, and its password (a private
/// instance on 127.0.0.1 only, gone with the test).
const DB_USER: &str = "slurm";
const DB_PASS: &str = "gpumode-test";
const DB_NAME: &str = "slurm_acct_db";
/// slurm.conf's ClusterName, which sacctmgr registers.
pub const CLUSTER_NAME: &str = "gpumode";
/// The account every test user's jobs are charged to.
const ACCOUNT: &str = "gpumode";

/// The two ports of a cluster's accounting: slurmdbd's and MariaDB's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountingDb {
    pub dbd_port: u16,
    pub mariadb_port: u16,
}

impl AccountingDb {
    pub fn on_free_ports() -> AccountingDb {
        AccountingDb { dbd_port: crate::conf::free_port(), mariadb_port: crate::conf::free_port() }
    }
}

/// The programs a cluster with accounting needs, and the Debian package of
/// each: MariaDB's from the system, Slurm's from `install` (the prefix, if any).
fn programs(install: &SlurmInstall) -> [(PathBuf, &'static str); 5] {
    [
        (PathBuf::from("/usr/sbin/mariadbd"), "mariadb-server"),
        (PathBuf::from("/usr/bin/mariadb-install-db"), "mariadb-server"),
        (install.sbin("slurmdbd"), "slurmdbd"),
        (install.plugin_dir().join("accounting_storage_mysql.so"), "slurm-wlm-mysql-plugin, with slurmdbd"),
        (install.bin("sacct"), "slurm-client"),
    ]
}

/// What is missing to run accounting here (`install ...` advice), if anything.
pub fn missing_programs(install: &SlurmInstall) -> Option<String> {
    let missing: Vec<String> = programs(install)
        .iter()
        .filter(|(p, _)| !p.exists())
        .map(|(p, pkg)| format!("{} (apt package {pkg})", p.display()))
        .collect();
    (!missing.is_empty()).then(|| format!("missing {}: apt-get install slurmdbd mariadb-server", missing.join(", ")))
}

fn db_dir(cluster_dir: &Path) -> PathBuf {
    cluster_dir.join("db")
}

/// slurm.conf's accounting lines (enforcement stays off: jobs of users
/// without an association are still accepted). AccountingStoragePass names
/// the munge socket for slurmdbd's connections: without it slurmctld and
/// sacctmgr try the system's (/run/munge), not AuthInfo's.
pub fn slurm_conf_lines(cluster_dir: &Path, db: Option<&AccountingDb>) -> String {
    match db {
        None => "AccountingStorageType=accounting_storage/none\n".into(),
        Some(db) => format!(
            "AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=localhost\nAccountingStoragePort={}\n\
             AccountingStoragePass={}\n",
            db.dbd_port,
            cluster_dir.join("munge/munge.socket").display()
        ),
    }
}

/// Initialises the database's data directory and writes slurmdbd.conf and
/// the SQL that creates slurmdbd's database user.
pub fn write(cluster_dir: &Path, db: &AccountingDb, install: &SlurmInstall) -> Result<()> {
    if let Some(why) = missing_programs(install) {
        bail!("accounting_db: {why}");
    }
    let dir = db_dir(cluster_dir);
    std::fs::create_dir_all(&dir)?;
    let started = Instant::now();
    install_data_dir(&dir)?;
    eprintln!("MariaDB data directory initialised in {:.1} s", started.elapsed().as_secs_f64());
    let grant = format!(
        "CREATE USER IF NOT EXISTS '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{DB_PASS}';\n\
         GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'127.0.0.1';\n"
    );
    crate::conf::write(&dir, "init.sql", &grant, 0o600)?;
    // slurmdbd refuses a slurmdbd.conf others can read (it holds the
    // password); it runs as root, the harness's SlurmUser.
    let plugin_dir = install.prefixed.then(|| install.plugin_dir());
    crate::conf::write(cluster_dir, "slurmdbd.conf", &slurmdbd_conf(cluster_dir, db, plugin_dir.as_deref()), 0o600)
}

/// `mariadb-install-db` into `<dir>/data`, as root (the daemon runs as
/// root too: no mysql-owned files in the cluster's directory).
fn install_data_dir(dir: &Path) -> Result<()> {
    let mut cmd = Command::new("/usr/bin/mariadb-install-db");
    cmd.arg("--no-defaults")
        .arg(format!("--datadir={}", dir.join("data").display()))
        .args(["--user=root", "--auth-root-authentication-method=socket", "--skip-test-db"]);
    let out = crate::process::output_with_timeout(cmd, Duration::from_secs(120))?;
    if !out.status.success() {
        bail!("mariadb-install-db failed ({}): {}{}", out.status, String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

fn slurmdbd_conf(cluster_dir: &Path, db: &AccountingDb, plugin_dir: Option<&Path>) -> String {
    let d = cluster_dir.display();
    let plugin_dir = plugin_dir.map(|p| format!("PluginDir={}\n", p.display())).unwrap_or_default();
    format!(
        "# Generated by the slurm-gpu-mode test harness.
AuthType=auth/munge
AuthInfo=socket={d}/munge/munge.socket
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={dbd_port}
SlurmUser=root
PidFile={d}/slurmdbd.pid
LogFile={d}/log/slurmdbd.log
DebugLevel=info
{plugin_dir}StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={mariadb_port}
StorageUser={DB_USER}
StoragePass={DB_PASS}
StorageLoc={DB_NAME}
",
        dbd_port = db.dbd_port,
        mariadb_port = db.mariadb_port,
    )
}

/// Starts MariaDB and slurmdbd and registers the cluster, its account and
/// the users that submit jobs; before slurmctld, which then finds its
/// cluster in the database.
pub fn start(c: &Cluster, db: &AccountingDb) -> Result<()> {
    let started = Instant::now();
    start_mariadb(&c.dir, db)?;
    wait_listening(db.mariadb_port, Duration::from_secs(60)).context("MariaDB did not come up (see log/mariadbd.log)")?;
    let conf = c.dir.join("slurm.conf");
    c.daemon_with_env(&c.install.sbin("slurmdbd"), &[], &[("SLURM_CONF", conf.to_str().unwrap())])?;
    wait_dbd_answers(c, Duration::from_secs(60))?;
    register(c)?;
    eprintln!("accounting database up in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// mariadbd stays in the foreground: it is spawned in a process group of
/// its own and reaped by a thread; its pid file stops it (process::PID_FILES).
fn start_mariadb(cluster_dir: &Path, db: &AccountingDb) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let dir = db_dir(cluster_dir);
    let arg = |k: &str, v: &Path| format!("--{k}={}", v.display());
    let mut child = Command::new("/usr/sbin/mariadbd")
        .arg("--no-defaults")
        .arg("--user=root")
        .arg(arg("datadir", &dir.join("data")))
        .arg(arg("socket", &dir.join("mariadbd.sock")))
        .arg(arg("pid-file", &dir.join("mariadbd.pid")))
        .arg(arg("log-error", &cluster_dir.join("log/mariadbd.log")))
        .arg(arg("init-file", &dir.join("init.sql")))
        .args(["--bind-address=127.0.0.1", "--skip-name-resolve", "--innodb-buffer-pool-size=32M"])
        .arg(format!("--port={}", db.mariadb_port))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .context("cannot run /usr/sbin/mariadbd (apt package mariadb-server)")?;
    std::thread::spawn(move || child.wait());
    Ok(())
}

/// MariaDB accepts connections once the init file has run.
fn wait_listening(port: u16, timeout: Duration) -> Result<()> {
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if start.elapsed() > timeout {
            bail!("nothing listens on 127.0.0.1:{port} after {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// slurmdbd answers once sacctmgr can list clusters through it.
fn wait_dbd_answers(c: &Cluster, timeout: Duration) -> Result<()> {
    let start = Instant::now();
    loop {
        let out = c.client("sacctmgr", &["-n", "-P", "show", "cluster"]).timeout(Duration::from_secs(15)).run_as_root();
        match out {
            Ok(o) if o.status.success() => return Ok(()),
            Ok(o) if start.elapsed() > timeout => {
                bail!("slurmdbd does not answer: sacctmgr {}\n{}", String::from_utf8_lossy(&o.stderr), c.logs_tail())
            }
            Err(e) if start.elapsed() > timeout => bail!("slurmdbd does not answer: {e:#}\n{}", c.logs_tail()),
            _ => std::thread::sleep(Duration::from_millis(250)),
        }
    }
}

/// The cluster, one account, and root and the test users in it.
fn register(c: &Cluster) -> Result<()> {
    let users = std::iter::once("root").chain(crate::users::TEST_USERS.iter().copied()).filter(|u| crate::users::lookup(u).is_ok());
    let users = users.collect::<Vec<_>>().join(",");
    let account = format!("account={ACCOUNT}");
    let cluster = format!("cluster={CLUSTER_NAME}");
    for args in [
        vec!["add", "cluster", CLUSTER_NAME],
        vec!["add", "account", ACCOUNT, cluster.as_str()],
        vec!["add", "user", users.as_str(), account.as_str(), cluster.as_str()],
    ] {
        let out = c.client("sacctmgr", &[&["-i"], args.as_slice()].concat()).run_as_root()?;
        if !out.status.success() {
            bail!("sacctmgr -i {} failed: {}{}", args.join(" "), String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        }
    }
    Ok(())
}
