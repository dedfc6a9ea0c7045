#!/bin/sh
# How docs/img/dashboard.png was made: a real Prometheus scrapes the metrics
# textfile of a churn run (gpu-mode-churn: a real local Slurm, a simulated
# 8-GPU H200 node, jobs of every mode) every second, then
# render_dashboard.py evaluates each panel's own queries of
# gpu-mode-dashboard.json against it and draws them (Grafana itself is no
# Debian package). A plain HTTP server stands in for node_exporter's
# textfile collector: both serve the file as it is.
#
#   sh packaging/grafana/render-picture.sh [JOBS [CHURN ARGS...]]   (root; cargo build --workspace first;
#                                                     apt-get install prometheus python3-matplotlib)
# The picture in docs/metrics.md: render-picture.sh 60 --preempt-percent 100 --max-secs 4
set -eu
cd "$(dirname "$0")/../.."
jobs=${1:-40}
[ $# -gt 0 ] && shift
base=${GPU_MODE_CLUSTER_BASE:-/tmp/gpu-mode-cluster}
work="$base/dashboard-picture"
rm -rf "$work"
mkdir -p "$work"
free_port() { /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
http_port=$(free_port)
prom_port=$(free_port)
/usr/bin/python3 -m http.server --bind 127.0.0.1 --directory "$base" "$http_port" > "$work/http.log" 2>&1 &
http_pid=$!
cat > "$work/prometheus.yml" <<EOT
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: gpu-mode
    metrics_path: /churn-bench/textfile/gpu-mode.prom
    static_configs:
      - targets: ["127.0.0.1:$http_port"]
        labels: {instance: "churn-node"}
EOT
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
    --web.listen-address="127.0.0.1:$prom_port" > "$work/prometheus.log" 2>&1 &
prom_pid=$!
trap 'kill $http_pid $prom_pid 2>/dev/null || true' EXIT
start=$(date +%s)
set +e
target/debug/gpu-mode-churn --jobs "$jobs" "$@" > "$work/churn.txt" 2>&1
churn_rc=$?
set -e
end=$(date +%s)
echo "churn: exit $churn_rc, $((end - start)) s (report: $work/churn.txt)"
/usr/bin/python3 packaging/grafana/render_dashboard.py --dashboard packaging/grafana/gpu-mode-dashboard.json \
    --prometheus "http://127.0.0.1:$prom_port" --start "$start" --end "$end" --rate-interval 20s --out docs/img/dashboard.png \
    --subtitle "gpu-mode-churn --jobs $jobs $* on a simulated 8-GPU H200 node of a real Slurm, scraped every 1 s by Prometheus $(prometheus --version 2>&1 | awk 'NR==1{print $3}'), $(date -u +%F)"
