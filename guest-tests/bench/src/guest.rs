//! The bench's guest scripts: the `.sh` files in `guest/` (what each step
//! does) with the jobs of a boot appended as calls (which steps, with
//! which fio options).

use p2plab_lab::GuestScript;

use crate::jobs::{p2p_labels, Job, COPY_BUFFERS, CPU_SERVERS, P2P, RDMA_SOURCES};

const NVME_JOBS: &str = include_str!("../guest/nvme-jobs.sh");
const COPY: &str = include_str!("../guest/copy.sh");
const RDMA: &str = include_str!("../guest/rdma.sh");

/// `fio_job LABEL MEMORY FIO_OPTION...`.
fn fio_job(label: &str, memory: &str, job: &Job) -> Vec<String> {
    ["fio_job", label, memory]
        .into_iter()
        .chain(job.fio.split_whitespace())
        .map(str::to_owned)
        .collect()
}

/// `cpu_mark LABEL AT SERVER...`: the servers' CPU time and NVMe counters
/// at the `begin` or `end` of a job.
fn cpu_mark(label: &str, at: &str) -> Vec<String> {
    ["cpu_mark", label, at]
        .into_iter()
        .chain(CPU_SERVERS.iter().copied())
        .map(str::to_owned)
        .collect()
}

/// The fio jobs of an NVMe boot, `runtime` seconds each, each compared
/// job between host CPU marks (`host_mark`); with `p2p`, each
/// P2P job into 4 KiB-page RAM (first, so that it gets the least
/// fragmented memory of the three), into RAM and into the GPU's p2pmem,
/// the last two between CPU marks.
pub fn nvme_jobs(jobs: &[&Job], runtime: u32, p2p: bool) -> GuestScript {
    let mut script = GuestScript::new("nvme-jobs.sh", NVME_JOBS).var("RUNTIME", runtime);
    for job in jobs {
        script = script
            .call(["host_mark", job.name, "begin"])
            .call(fio_job(job.name, "ram", job))
            .call(["host_mark", job.name, "end"]);
    }
    if !p2p {
        return script;
    }
    script = script.call(["find_gpu"]);
    for job in P2P {
        let [ram4k, ram, p2pmem] = p2p_labels(job);
        let mut with_4k_pages = vec!["with_4k_pages".to_owned()];
        with_4k_pages.extend(fio_job(&ram4k, "ram", job));
        script = script.call(with_4k_pages);
        for (label, memory) in [(ram, "ram"), (p2pmem, "p2pmem")] {
            script = script
                .call(cpu_mark(&label, "begin"))
                .call(fio_job(&label, memory, job))
                .call(cpu_mark(&label, "end"));
        }
    }
    script
}

/// nvme0 → nvme1 copies of `len` bytes through each of [`COPY_BUFFERS`].
pub fn copies(len: &str) -> GuestScript {
    COPY_BUFFERS.iter().fold(
        GuestScript::new("copy.sh", COPY).var("COPY_LEN", len),
        |s, (name, buffer)| s.call(["copy_via", name, buffer]),
    )
}

/// nic0 → wire → nic1 transfers of `len` bytes in posts of `post` from and
/// into each of [`RDMA_SOURCES`] (seeds 1, 2, 3...).
pub fn rdma(len: &str, post: &str) -> GuestScript {
    let script = GuestScript::new("rdma.sh", RDMA)
        .var("RDMA_LEN", len)
        .var("RDMA_POST", post);
    RDMA_SOURCES
        .iter()
        .enumerate()
        .fold(script, |s, (n, source)| {
            s.call(["xfer", source, &(n + 1).to_string()])
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::{selected, COMPARED};

    fn calls(script: &GuestScript, file: &str) -> Vec<String> {
        let text = script.render().expect("the script renders");
        let body = file.split_once('\n').expect("a shebang line").1;
        let (_, calls) = text.split_once(body).expect("the file's text");
        calls.lines().map(str::to_owned).collect()
    }

    /// Catches: a job run twice or not at all, the 4 KiB-page RAM job
    /// run with THP on, CPU marks missing around a P2P job (its server
    /// CPU row would fail) or around the wrong one, p2pmem used by an
    /// anchor boot, `--only` ignored, and a compared job not between
    /// its own host CPU marks.
    #[test]
    fn an_nvme_boot_runs_every_job_once_in_its_memory() {
        let plan = calls(&nvme_jobs(&selected(&[]), 5, true), NVME_JOBS);
        for job in COMPARED {
            let want = format!("fio_job {} ram {}", job.name, job.fio);
            assert_eq!(plan.iter().filter(|c| **c == want).count(), 1, "{want}");
            let at = plan.iter().position(|c| *c == want).unwrap();
            assert_eq!(plan[at - 1], format!("host_mark {} begin", job.name));
            assert_eq!(plan[at + 1], format!("host_mark {} end", job.name));
        }
        let first_p2p = plan.iter().position(|c| c == "find_gpu").unwrap();
        assert_eq!(first_p2p, 3 * COMPARED.len());
        for job in P2P {
            let at = plan
                .iter()
                .position(|c| {
                    *c == format!("with_4k_pages fio_job ram4k-{} ram {}", job.name, job.fio)
                })
                .unwrap_or_else(|| panic!("no ram4k job for {}: {plan:?}", job.name));
            let servers = CPU_SERVERS.join(" ");
            for (i, (label, memory)) in [("ram", "ram"), ("p2p", "p2pmem")].iter().enumerate() {
                let label = format!("{label}-{}", job.name);
                assert_eq!(
                    plan[at + 1 + 3 * i..at + 4 + 3 * i],
                    [
                        format!("cpu_mark {label} begin {servers}"),
                        format!("fio_job {label} {memory} {}", job.fio),
                        format!("cpu_mark {label} end {servers}"),
                    ]
                );
            }
        }
        assert_eq!(plan.len(), 3 * COMPARED.len() + 1 + 7 * P2P.len());
        let anchor = calls_text(&nvme_jobs(&selected(&[]), 5, false));
        assert!(!anchor.contains("p2pmem") && !anchor.contains("find_gpu"));
        let one = calls(
            &nvme_jobs(&selected(&["4k-randread-qd32".to_owned()]), 5, false),
            NVME_JOBS,
        );
        assert_eq!(
            one,
            [
                "host_mark 4k-randread-qd32 begin".to_owned(),
                format!("fio_job 4k-randread-qd32 ram {}", COMPARED[0].fio),
                "host_mark 4k-randread-qd32 end".to_owned(),
            ]
        );
    }

    fn calls_text(script: &GuestScript) -> String {
        calls(script, NVME_JOBS).join("\n")
    }

    /// Catches: a copy buffer or RDMA memory the host reads a result for
    /// but the guest never runs (the run would fail after a whole boot),
    /// and the lengths not reaching the guest.
    #[test]
    fn copies_and_transfers_cover_every_buffer_and_memory() {
        let copy = copies("64M");
        assert_eq!(
            calls(&copy, COPY),
            [
                "copy_via ram ram",
                "copy_via gpu0-p2pmem gpu",
                "copy_via nvme1-cmb nvme1"
            ]
        );
        assert!(copy.render().unwrap().contains("export COPY_LEN=64M\n"));
        let rdma = rdma("64M", "256K");
        assert_eq!(
            calls(&rdma, RDMA),
            ["xfer ram 1", "xfer gpu 2", "xfer dmabuf 3"]
        );
        let text = rdma.render().unwrap();
        assert!(text.contains("export RDMA_LEN=64M\nexport RDMA_POST=256K\n"));
    }
}
