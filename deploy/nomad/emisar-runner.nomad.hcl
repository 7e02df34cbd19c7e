# One emisar runner on every Nomad client node (a system job).
#
# The runner must act on the node itself (its FRR, its systemd, its /proc, services on its
# loopback), so it runs with raw_exec, outside any container, as the unprivileged user
# emisar-runner. Each node needs, before this job can place there:
#   - the emisar package (the binary at /usr/bin/emisar-runner and the user emisar-runner): the
#     runner and the server must load byte-identical packs, so use the version the server runs;
#   - raw_exec enabled in the client config (plugin "raw_exec" { config { enabled = true } })
#     and a client that runs as root, so that it can start the task as emisar-runner;
#   - whatever its packs need (group frrvty for vtysh, the polkit rule for systemctl restarts:
#     see deploy/README.md).
#
# The runners join the server with a join token kept in a Nomad variable. One token admits
# as many runners as its --uses, admits the names its --name-pattern matches, and grants them
# exactly its labels and packs (a runner cannot ask for others; it is sent calls only for the
# granted packs), so issue one per datacenter:
#   emisar join-token issue --server-config emisar.toml --uses 50 --ttl 24h --label dc=dc1 \
#       --name-pattern 'nomad-*' --pack linux --pack debian --pack traefik --pack frr
#   nomad var put nomad/jobs/emisar-runner server=https://emisar.example.internal join_token=emj_…
# A runner that joined keeps its own credential in /var/lib/emisar-runner (made by the
# package, mode 0700) and re-registers with it on every restart, so the token is needed once
# per node: after it expires, only new nodes need a fresh one. The server must have a
# certificate the node trusts: the system's roots, or the CA that server_ca_file names in
# runner.toml below (uncomment it, and put the CA on every node).
#
#   nomad job run deploy/nomad/emisar-runner.nomad.hcl
job "emisar-runner" {
  type        = "system"
  datacenters = ["*"]

  update {
    max_parallel = 1
    stagger      = "30s"
  }

  group "runner" {
    network {
      port "runner" {
        static = 7701
      }
    }

    restart {
      attempts = 10
      interval = "5m"
      delay    = "5s"
      mode     = "delay"
    }

    task "runner" {
      driver = "raw_exec"
      user   = "emisar-runner"

      config {
        command = "/usr/bin/emisar-runner"
        args    = ["--config", "${NOMAD_TASK_DIR}/runner.toml"]
      }

      # The join token reaches the runner as EMISAR_JOIN_TOKEN, from the task's secrets
      # directory, never in argv or in the rendered runner.toml.
      template {
        destination = "secrets/join.env"
        env         = true
        change_mode = "restart"
        data        = <<-EOT
          {{ with nomadVar "nomad/jobs/emisar-runner" -}}
          EMISAR_JOIN_TOKEN={{ .join_token }}
          {{- end }}
        EOT
      }

      # The runner's name is the node's name; agents and policies refer to runners by it.
      # advertise_url is where the server calls this runner: the node's own address, never
      # the wildcard it listens on. The runner serves HTTPS with a self-signed certificate it
      # makes once in its state_dir; it sends the fingerprint when it joins and the server
      # pins it. Its labels are the join token's.
      template {
        destination = "local/runner.toml"
        change_mode = "restart"
        data        = <<-EOT
          name = "{{ env "node.unique.name" }}"
          listen = "0.0.0.0:{{ env "NOMAD_PORT_runner" }}"
          advertise_url = "https://{{ env "attr.unique.network.ip-address" }}:{{ env "NOMAD_PORT_runner" }}"
          state_dir = "/var/lib/emisar-runner"
          # The CA that signed the server's certificate, when it is not in the system's store.
          # server_ca_file = "/etc/emisar/tls/server-ca.crt"

          # Restarts allowed on every node; keep it in step with the polkit rule.
          [allowlists]
          systemd_units = ["consul", "nomad"]

          # The server it joins and re-registers with at every start (the token comes once,
          # from secrets/join.env).
          [join]
          server = "{{ with nomadVar "nomad/jobs/emisar-runner" }}{{ .server }}{{ end }}"
        EOT
      }

      service {
        name     = "emisar-runner"
        port     = "runner"
        provider = "nomad"

        # Liveness only: the runner's certificate is self-signed, and the server (not this
        # check) verifies it, by its pinned fingerprint.
        check {
          type            = "http"
          protocol        = "https"
          tls_skip_verify = true
          path            = "/healthz"
          interval        = "10s"
          timeout         = "2s"
        }
      }

      resources {
        cpu    = 100
        memory = 64
      }
    }
  }
}
