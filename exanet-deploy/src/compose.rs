//! `exactl rack compose`: a virtual rack as a docker compose project.
//!
//! ```text
//! OUT/.env                      COMPOSE_PROJECT_NAME (v1 and v2 both read it)
//! OUT/docker-compose.yml        one service per node, the `pki` one-shot, [prometheus, grafana]
//! OUT/rack/rack.toml            static addresses on the compose network, [deploy] kind = "compose"
//! OUT/prometheus/prometheus.yml scrape configuration, every node          (--prometheus)
//! OUT/prometheus/consoles/...   the rack view, link and node pages (consoles.rs)
//! OUT/grafana/...               datasource, dashboard provider, dashboards (--grafana)
//! OUT/swarm/docker-stack.yml    the same rack for `docker stack deploy` (names, not addresses)
//! OUT/swarm/rack/rack.toml
//! OUT/swarm/prometheus.yml                                                 (--prometheus)
//! ```
//!
//! Addressing: every container has a static address on a bridge network with a fixed
//! subnet, so that the `link` and `metrics` addresses in rack.toml are reachable from the
//! host (exactl, a Prometheus on the host) and survive a container's restart. Nodes take
//! `subnet + 16 + id`; Prometheus and Grafana `+2`, `+3`; containers without a static
//! address get one from the subnet's upper half (`ip_range`), so they never take a node's.
//!
//! The compose file uses the Compose Specification subset that docker-compose 1.29 (v1)
//! and compose v2 both accept: no `version`, no top-level `name` (v1 refuses it; the
//! project name comes from `.env`), `depends_on` with `service_completed_successfully`.
//! Swarm needs another file: `docker stack deploy` validates against the 3.x schema (no
//! depends_on conditions, no ipc) and cannot give tasks static addresses.

use std::path::Path;

use exanet_control::rack::Deploy;
use exanet_proto::Shape;

use crate::error::{DeployError, Result};
use crate::yaml::{flow, int, render, s, MapBuilder, Yaml};
use crate::{
    check_options, consoles, grafana, rack_file, rack_name, rack_toml, write_files, GenFile,
    Subnet, METRICS_PORT, RACK_GITIGNORE, RACK_MOUNT,
};

/// Default compose network: a /16 in 10/8 unlikely to be in use (docker's own pools are
/// 172.17+/16 and 192.168/20s).
pub const DEFAULT_SUBNET: &str = "10.213.0.0/16";
/// Offsets of the fixed addresses in the subnet (the gateway takes +1).
const PROMETHEUS_OFFSET: u32 = 2;
const GRAFANA_OFFSET: u32 = 3;
const NODE_OFFSET: u32 = 16;
/// Images of the observability services, overridable at `up` through the environment.
pub const PROMETHEUS_IMAGE: &str = "prom/prometheus:v2.53.0";
pub const GRAFANA_IMAGE: &str = "grafana/grafana:10.4.2";
/// How often Prometheus scrapes every node. 5 s keeps `rate()` panels responsive; a
/// 128-node rack then serves ~26 small scrapes a second.
const SCRAPE_INTERVAL: &str = "5s";
/// The command that makes these files, for their notes.
const GENERATOR: &str = "exactl rack compose";
/// Where the Prometheus container finds the console pages and their library.
const CONSOLES_MOUNT: &str = "/etc/prometheus/consoles";
const CONSOLE_LIBRARIES_MOUNT: &str = "/etc/prometheus/console_libraries";
/// Docker health probes run as an exec in the container, which costs the host far more
/// than the probe itself: at 15 s, 128 nodes make ~8.5 execs a second.
const HEALTH_INTERVAL: &str = "15s";

#[derive(Clone, Debug)]
pub struct ComposeOptions {
    pub shape: Shape,
    /// Rack, compose project and stack name [default: exanet-<shape>].
    pub name: Option<String>,
    pub subnet: Subnet,
    pub image: String,
    pub prometheus: bool,
    pub grafana: bool,
}

impl ComposeOptions {
    /// Defaults for `shape` (tests build on them).
    #[cfg(test)]
    pub fn new(shape: Shape) -> ComposeOptions {
        ComposeOptions {
            shape,
            name: None,
            subnet: DEFAULT_SUBNET.parse().expect("the default subnet is valid"),
            image: crate::DEFAULT_IMAGE.to_string(),
            prometheus: false,
            grafana: false,
        }
    }

    pub fn name(&self) -> String {
        rack_name(self.name.as_deref(), self.shape)
    }
}

/// Node names in id order.
fn node_names(shape: &Shape) -> Vec<String> {
    shape.node_ids().map(|id| shape.display(id)).collect()
}

/// Checks every option; the generated files, nothing written.
pub fn generate(opts: &ComposeOptions) -> Result<Vec<GenFile>> {
    let name = opts.name();
    check_options(&name, opts.shape, &opts.image)?;
    if opts.grafana && !opts.prometheus {
        return Err(DeployError::BadValue {
            what: "--grafana",
            value: "without --prometheus".into(),
            message: "Grafana's dashboards read the rack's Prometheus; add --prometheus".into(),
        });
    }
    let n = opts.shape.nodes();
    let need = u64::from(NODE_OFFSET + n);
    let room = opts.subnet.size() / 2;
    if need > room {
        // Smallest prefix whose lower half holds the fixed addresses and every node.
        let mut prefix = opts.subnet.prefix;
        while prefix > 8 && (1u64 << (32 - u32::from(prefix))) / 2 < need {
            prefix -= 1;
        }
        return Err(DeployError::BadValue {
            what: "--subnet",
            value: opts.subnet.to_string(),
            message: format!(
                "a {} rack needs {need} static addresses in the lower half of the subnet \
                 ({room} there); use a /{prefix} or larger",
                opts.shape
            ),
        });
    }

    let names = node_names(&opts.shape);
    let addr = |i: usize| opts.subnet.host(NODE_OFFSET + i as u32).to_string();
    let mut files = vec![
        GenFile::new(
            ".env",
            format!(
                "# Read by docker-compose (v1) and docker compose (v2) in this directory.\n\
                 COMPOSE_PROJECT_NAME={name}\n\
                 # docker-compose 1.29 takes its parallelism slots for each service and then\n\
                 # again for the service's container: with more services than slots (default\n\
                 # 64) every slot waits for another and `up` hangs. One slot per service and more.\n\
                 COMPOSE_PARALLEL_LIMIT={}\n",
                parallel_limit(n)
            ),
        ),
        GenFile::new("docker-compose.yml", compose_file(opts, &name, &names)?),
        GenFile::new(
            "rack/rack.toml",
            rack_toml(
                &rack_file(&name, opts.shape, addr, deploy(&name)),
                &format!(
                    "Rack {name} ({}, {n} nodes) for docker compose: every node's container has a\n\
                     static address on the compose network {} (reachable from the host).\n\
                     Generated by `exactl rack compose`; certificates: `exactl rack pki`.",
                    opts.shape, opts.subnet
                ),
            )?,
        ),
        GenFile::new("rack/.gitignore", RACK_GITIGNORE),
        GenFile::new("swarm/docker-stack.yml", stack_file(opts, &name, &names)),
        GenFile::new(
            "swarm/rack/rack.toml",
            rack_toml(
                &rack_file(
                    &name,
                    opts.shape,
                    |i| names[i].clone(),
                    Deploy::External {
                        how: format!(
                            "docker swarm stack {name}: `docker service update --force \
                             {name}_NODE` restarts a node, `docker stack rm {name}` stops the rack"
                        ),
                    },
                ),
                &format!(
                    "Rack {name} ({}, {n} nodes) for docker swarm (`docker stack deploy`): nodes\n\
                     find each other by service name on the stack's overlay network.\n\
                     Generated by `exactl rack compose`; certificates: `exactl rack pki`.",
                    opts.shape
                ),
            )?,
        ),
        GenFile::new("swarm/rack/.gitignore", RACK_GITIGNORE),
    ];
    if opts.prometheus {
        let targets: Vec<String> = (0..names.len())
            .map(|i| format!("{}:{METRICS_PORT}", addr(i)))
            .collect();
        files.push(GenFile::new(
            "prometheus/prometheus.yml",
            prometheus_config(&name, &targets, SCRAPE_INTERVAL, GENERATOR),
        ));
        let targets: Vec<String> = names
            .iter()
            .map(|n| format!("{n}:{METRICS_PORT}"))
            .collect();
        files.push(GenFile::new(
            "swarm/prometheus.yml",
            prometheus_config(&name, &targets, SCRAPE_INTERVAL, GENERATOR),
        ));
        // The console pages (rack view, a page per link and per node), for both.
        for f in consoles::files(opts.shape, &name) {
            files.push(GenFile::new(Path::new("prometheus").join(&f.path), f.text));
        }
    }
    if opts.grafana {
        files.extend(grafana::files(opts.shape, &name)?);
    }
    Ok(files)
}

/// Generates and writes; returns what was made and how to start it.
pub fn run(out: &Path, opts: &ComposeOptions) -> Result<String> {
    let files = generate(opts)?;
    write_files(out, &files)?;
    let name = opts.name();
    let view = if opts.prometheus {
        format!(
            "\nrack view: http://127.0.0.1:9090/consoles/{} (Prometheus, once up)",
            consoles::RACK_PAGE
        )
    } else {
        String::new()
    };
    Ok(format!(
        "wrote compose rack {name:?} ({}, {} nodes, network {}) to {}: {} files\n\
         start: cd {} && docker-compose up -d   (or: docker compose up -d)\n\
         swarm: cd {}/swarm && docker stack deploy -c docker-stack.yml {name}{view}",
        opts.shape,
        opts.shape.nodes(),
        opts.subnet,
        out.display(),
        files.len(),
        out.display(),
        out.display()
    ))
}

/// `COMPOSE_PARALLEL_LIMIT` for a rack of `nodes`: above the number of services (nodes,
/// their IP services, pki, prometheus, grafana), so compose v1's nested parallel execution
/// cannot deadlock.
fn parallel_limit(nodes: u32) -> u32 {
    (2 * nodes + 8).max(64)
}

fn deploy(name: &str) -> Deploy {
    Deploy::Compose {
        project: name.to_string(),
        file: "../docker-compose.yml".into(),
    }
}

fn image_ref(opts: &ComposeOptions) -> Yaml {
    s(format!("${{EXANET_IMAGE:-{}}}", opts.image))
}

fn healthcheck() -> Yaml {
    MapBuilder::new()
        .put(
            "test",
            flow([
                "CMD",
                "busybox",
                "wget",
                "-q",
                "-O",
                "/dev/null",
                &format!("http://127.0.0.1:{METRICS_PORT}/health"),
            ]),
        )
        .put("interval", s(HEALTH_INTERVAL))
        .put("timeout", s("5s"))
        .put("retries", int(3))
        .put("start_period", s("5s"))
        .build()
}

fn node_environment(node: &str) -> Yaml {
    MapBuilder::new()
        .put("EXANET_RACK", s(RACK_MOUNT))
        .put("EXANET_NODE", s(node))
        .put("RUST_LOG", s("${RUST_LOG:-info}"))
        .build()
}

fn node_labels(rack: &str, node: &str) -> Yaml {
    MapBuilder::new()
        .put("org.exanet.rack", s(rack))
        .put("org.exanet.node", s(node))
        .build()
}

fn daemon_command(node: &str) -> Yaml {
    flow(["exanetd", "--rack", RACK_MOUNT, "--node", node])
}

fn rack_volume() -> Yaml {
    Yaml::List(vec![s(format!("./rack:{RACK_MOUNT}"))])
}

/// `depends_on` one service, started once `condition` holds.
fn depends_on(service: &str, condition: &str) -> Yaml {
    MapBuilder::new()
        .put(
            service,
            MapBuilder::new().put("condition", s(condition)).build(),
        )
        .build()
}

/// The `pki` one-shot as compose and swarm both run it: it makes the rack's certificates
/// in the bind-mounted rack directory.
fn pki_service(opts: &ComposeOptions) -> MapBuilder {
    MapBuilder::new()
        .put("image", image_ref(opts))
        .put(
            "command",
            flow(["exactl", "--rack", RACK_MOUNT, "rack", "pki"]),
        )
        .put("volumes", rack_volume())
}

/// What a node's service is in compose and in swarm alike: image, command, host name and
/// environment.
fn node_service(opts: &ComposeOptions, node: &str) -> MapBuilder {
    MapBuilder::new()
        .put("image", image_ref(opts))
        .put("command", daemon_command(node))
        .put("hostname", s(node.to_ascii_lowercase()))
        .put("environment", node_environment(node))
}

/// The port a node's IP service serves `/metrics` on (in the node's network namespace).
pub const IP_METRICS_PORT: u16 = 9701;

/// Node `node`'s IP over ExaNet service: `exanet-ip` in the node container's network
/// namespace (`network_mode: service:NODE`: the container is the node's namespace), with
/// what a TUN device needs (`/dev/net/tun`, `NET_ADMIN`), attached to the node's daemon
/// through the shared rack directory. Restarted when it ends, as it does when its daemon
/// restarts (its attachment ends with the daemon).
fn ip_service(opts: &ComposeOptions, node: &str) -> MapBuilder {
    MapBuilder::new()
        .put("image", image_ref(opts))
        .put(
            "command",
            flow([
                "exanet-ip",
                "--rack",
                RACK_MOUNT,
                "--node",
                node,
                "--metrics",
                &format!("0.0.0.0:{IP_METRICS_PORT}"),
            ]),
        )
        .put("network_mode", s(format!("service:{node}")))
        .put("cap_add", Yaml::List(vec![s("NET_ADMIN")]))
        .put("devices", Yaml::List(vec![s("/dev/net/tun:/dev/net/tun")]))
        .put("environment", node_environment(node))
        .put("volumes", rack_volume())
        .put("restart", s("unless-stopped"))
        .put("depends_on", depends_on(node, "service_healthy"))
}

/// The Prometheus service as compose and swarm both run it: image, command (with `extra`
/// flags) and volumes, its configuration read from `config` and its console pages from
/// `consoles` (a directory holding `consoles/` and `console_libraries/`), both relative to
/// the compose or stack file.
fn prometheus_service(config: &str, consoles: &str, extra: &[&str]) -> MapBuilder {
    let templates = format!("--web.console.templates={CONSOLES_MOUNT}");
    let libraries = format!("--web.console.libraries={CONSOLE_LIBRARIES_MOUNT}");
    let mut command = vec![
        "--config.file=/etc/prometheus/prometheus.yml",
        "--storage.tsdb.path=/prometheus",
        &templates,
        &libraries,
    ];
    command.extend_from_slice(extra);
    MapBuilder::new()
        .put(
            "image",
            s(format!("${{EXANET_PROMETHEUS_IMAGE:-{PROMETHEUS_IMAGE}}}")),
        )
        .put("command", flow(command))
        .put(
            "volumes",
            Yaml::List(vec![
                s(format!("{config}:/etc/prometheus/prometheus.yml:ro")),
                s(format!(
                    "{consoles}/{}:{CONSOLES_MOUNT}:ro",
                    consoles::CONSOLE_DIR
                )),
                s(format!(
                    "{consoles}/{}:{CONSOLE_LIBRARIES_MOUNT}:ro",
                    consoles::LIBRARY_DIR
                )),
                s("prometheus-data:/prometheus"),
            ]),
        )
}

fn compose_file(opts: &ComposeOptions, name: &str, names: &[String]) -> Result<String> {
    let subnet = opts.subnet;
    let mut services = MapBuilder::new();
    services.push(
        "pki",
        pki_service(opts)
            .put("network_mode", s("none"))
            .put("restart", s("no"))
            .build(),
    );
    let mut first = true;
    for (i, node) in names.iter().enumerate() {
        let mut svc = node_service(opts, node)
            .put("labels", node_labels(name, node))
            .put("volumes", rack_volume())
            .put("networks", static_net(subnet, NODE_OFFSET + i as u32));
        svc = if first {
            svc.note(
                "Workload containers may join this node's IPC namespace (ipc: service:NODE or\n\
                 --ipc container:ID); the NI's shared memory itself is memfds passed over\n\
                 /rack/run/NODE.ni, counted in the container's memory, not in /dev/shm.",
                "ipc",
                s("shareable"),
            )
        } else {
            svc.put("ipc", s("shareable"))
        };
        svc = svc.put("shm_size", s("256m"));
        svc = if first {
            svc.note(
                "A restarted node keeps its address and rejoins its neighbours by itself.",
                "restart",
                s("unless-stopped"),
            )
        } else {
            svc.put("restart", s("unless-stopped"))
        };
        svc = svc
            .put("stop_grace_period", s("5s"))
            .put("healthcheck", healthcheck())
            .put(
                "depends_on",
                depends_on("pki", "service_completed_successfully"),
            );
        services.push(node.clone(), svc.build());
        services.push(format!("{node}-ip"), ip_service(opts, node).build());
        first = false;
    }
    let mut volumes = MapBuilder::new();
    if opts.prometheus {
        services.push(
            "prometheus",
            prometheus_service(
                "./prometheus/prometheus.yml",
                "./prometheus",
                &["--storage.tsdb.retention.time=7d"],
            )
            .put("networks", static_net(subnet, PROMETHEUS_OFFSET))
            .note(
                &format!(
                    "Published on the host's loopback only; set EXANET_PROMETHEUS_PORT to move it.\n\
                     The rack view: http://127.0.0.1:9090/consoles/{}",
                    consoles::RACK_PAGE
                ),
                "ports",
                Yaml::List(vec![s("127.0.0.1:${EXANET_PROMETHEUS_PORT:-9090}:9090")]),
            )
            .put("restart", s("unless-stopped"))
            .build(),
        );
        volumes.push("prometheus-data", Yaml::Map(vec![]));
    }
    if opts.grafana {
        services.push(
            "grafana",
            MapBuilder::new()
                .put(
                    "image",
                    s(format!("${{EXANET_GRAFANA_IMAGE:-{GRAFANA_IMAGE}}}")),
                )
                .put(
                    "environment",
                    MapBuilder::new()
                        .put("GF_AUTH_ANONYMOUS_ENABLED", s("true"))
                        .put("GF_AUTH_ANONYMOUS_ORG_ROLE", s("Viewer"))
                        .put(
                            "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH",
                            s(format!("{}/exanet-rack.json", grafana::DASHBOARD_MOUNT)),
                        )
                        .build(),
                )
                .put(
                    "volumes",
                    Yaml::List(vec![
                        s("./grafana/provisioning:/etc/grafana/provisioning:ro"),
                        s(format!(
                            "./grafana/dashboards:{}:ro",
                            grafana::DASHBOARD_MOUNT
                        )),
                        s("grafana-data:/var/lib/grafana"),
                    ]),
                )
                .put("networks", static_net(subnet, GRAFANA_OFFSET))
                .put(
                    "ports",
                    Yaml::List(vec![s("127.0.0.1:${EXANET_GRAFANA_PORT:-3000}:3000")]),
                )
                .put("restart", s("unless-stopped"))
                .put("depends_on", depends_on("prometheus", "service_started"))
                .build(),
        );
        volumes.push("grafana-data", Yaml::Map(vec![]));
    }
    let network = MapBuilder::new()
        .put("driver", s("bridge"))
        .put(
            "ipam",
            MapBuilder::new()
                .put(
                    "config",
                    Yaml::List(vec![MapBuilder::new()
                        .put("subnet", s(subnet.to_string()))
                        .put("ip_range", s(subnet.upper_half().to_string()))
                        .build()]),
                )
                .build(),
        )
        .build();
    let mut doc = MapBuilder::new()
        .note(
            &format!(
                "Virtual rack {name}: {} ({} nodes), one exanetd container per node.\n\
                 Generated by `exactl rack compose`; regenerate rather than edit.\n\
                 Start: docker-compose up -d (v1) or docker compose up -d (v2); the one-shot\n\
                 `pki` service creates the rack's certificates in ./rack/tls first.\n\
                 Workload: docker-compose exec {} exanet-perf pingpong serve",
                opts.shape,
                names.len(),
                names[0]
            ),
            "services",
            services.build(),
        )
        .note(
            &format!(
                "Static addresses for nodes from {} on; the upper half is for containers\n\
                 without one. Change the subnet with `exactl rack compose --subnet`.",
                subnet.host(NODE_OFFSET)
            ),
            "networks",
            MapBuilder::new().put("rack", network).build(),
        );
    if opts.prometheus || opts.grafana {
        doc = doc.put("volumes", volumes.build());
    }
    Ok(render(&doc.build()))
}

fn static_net(subnet: Subnet, offset: u32) -> Yaml {
    MapBuilder::new()
        .put(
            "rack",
            MapBuilder::new()
                .put("ipv4_address", s(subnet.host(offset).to_string()))
                .build(),
        )
        .build()
}

/// The swarm stack: same image, command and health check; names instead of addresses
/// (dnsrr: a service name resolves to its task's address, so QUIC peers see each other
/// directly rather than through a virtual IP); restart by swarm's policy.
fn stack_file(opts: &ComposeOptions, name: &str, names: &[String]) -> String {
    let mut services = MapBuilder::new();
    services.push(
        "pki",
        pki_service(opts)
            .note(
                "Swarm has no ordering between services: nodes that start before the\n\
                 certificates exist exit, and swarm starts them again 2 s later.",
                "deploy",
                MapBuilder::new()
                    .put(
                        "restart_policy",
                        MapBuilder::new().put("condition", s("none")).build(),
                    )
                    .build(),
            )
            .build(),
    );
    for node in names {
        services.push(
            node.clone(),
            node_service(opts, node)
                .put("volumes", rack_volume())
                .put("networks", Yaml::List(vec![s("rack")]))
                .put("stop_grace_period", s("5s"))
                .put("healthcheck", healthcheck())
                .put(
                    "deploy",
                    MapBuilder::new()
                        .put("endpoint_mode", s("dnsrr"))
                        .put("labels", node_labels(name, node))
                        .put(
                            "restart_policy",
                            MapBuilder::new()
                                .put("condition", s("any"))
                                .put("delay", s("2s"))
                                .build(),
                        )
                        .build(),
                )
                .build(),
        );
    }
    let mut volumes = MapBuilder::new();
    if opts.prometheus {
        services.push(
            "prometheus",
            prometheus_service("./prometheus.yml", "../prometheus", &[])
                .put("networks", Yaml::List(vec![s("rack")]))
                .put("ports", Yaml::List(vec![s("9090:9090")]))
                .build(),
        );
        volumes.push("prometheus-data", Yaml::Map(vec![]));
    }
    let mut doc = MapBuilder::new()
        .note(
            &format!(
                "Virtual rack {name} on docker swarm: docker stack deploy -c docker-stack.yml {name}\n\
                 Generated by `exactl rack compose`. The rack directory ./rack is bind-mounted:\n\
                 on several hosts it must be at the same path on each (a shared filesystem),\n\
                 or pin every node to the host that has it (deploy.placement)."
            ),
            "version",
            s("3.8"),
        )
        .put("services", services.build())
        .put(
            "networks",
            MapBuilder::new()
                .put(
                    "rack",
                    MapBuilder::new()
                        .put("driver", s("overlay"))
                        .put("attachable", Yaml::Bool(true))
                        .build(),
                )
                .build(),
        );
    if opts.prometheus {
        doc = doc.put("volumes", volumes.build());
    }
    render(&doc.build())
}

/// Prometheus configuration scraping every node of the rack (`targets`, their metrics
/// addresses) every `interval` (a Prometheus duration such as `5s`), as job `exanet`;
/// `generator` is the command that made it, for its note.
pub fn prometheus_config(
    name: &str,
    targets: &[String],
    interval: &str,
    generator: &str,
) -> String {
    let doc = MapBuilder::new()
        .put(
            "global",
            MapBuilder::new()
                .put("scrape_interval", s(interval))
                .put("evaluation_interval", s("15s"))
                .build(),
        )
        .note(
            &format!(
                "Every node of rack {name}: its exanetd serves /metrics on its `metrics`\n\
                 address. Generated by `{generator}`."
            ),
            "scrape_configs",
            Yaml::List(vec![MapBuilder::new()
                .put("job_name", s("exanet"))
                .put(
                    "static_configs",
                    Yaml::List(vec![MapBuilder::new()
                        .put(
                            "targets",
                            Yaml::List(targets.iter().map(|t| s(t.clone())).collect()),
                        )
                        .put("labels", MapBuilder::new().put("rack", s(name)).build())
                        .build()]),
                )
                .build()]),
        )
        .build();
    render(&doc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{assert_committed, text, LINK_PORT};
    use exanet_control::rack::{Rack, RackFile};
    use serde_yaml::Value;

    fn opts(shape: &str) -> ComposeOptions {
        ComposeOptions::new(shape.parse().unwrap())
    }

    fn yaml(text: &str) -> Value {
        serde_yaml::from_str(text).unwrap_or_else(|e| panic!("{e}\n{text}"))
    }

    #[test]
    fn compose_names_every_node_once_with_its_rack_address() {
        let mut o = opts("4x4x2");
        o.prometheus = true;
        o.grafana = true;
        let files = generate(&o).unwrap();
        let doc = yaml(text(&files, "docker-compose.yml"));
        let services = doc["services"].as_mapping().unwrap();
        let rack: RackFile = toml::from_str(text(&files, "rack/rack.toml")).unwrap();
        let rack = Rack::new(Path::new("."), rack).unwrap();
        assert_eq!(rack.file.deploy, Some(deploy("exanet-4x4x2")));
        let shape = rack.shape();
        let mut addrs = std::collections::HashSet::new();
        for id in shape.node_ids() {
            let name = shape.display(id);
            let svc = &services[name.as_str()];
            let ip = svc["networks"]["rack"]["ipv4_address"].as_str().unwrap();
            assert!(addrs.insert(ip.to_string()), "{ip} used twice");
            assert_eq!(rack.entry(id).link, format!("{ip}:{LINK_PORT}"));
            assert_eq!(rack.entry(id).metrics, format!("{ip}:{METRICS_PORT}"));
            let cmd: Vec<&str> = svc["command"]
                .as_sequence()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap())
                .collect();
            assert_eq!(cmd, ["exanetd", "--rack", "/rack", "--node", name.as_str()]);
            assert_eq!(
                svc["depends_on"]["pki"]["condition"].as_str(),
                Some("service_completed_successfully")
            );
            assert_eq!(svc["restart"].as_str(), Some("unless-stopped"));
            // Its IP service lives in its network namespace, with a TUN device.
            let ip = &services[format!("{name}-ip").as_str()];
            assert_eq!(
                ip["network_mode"].as_str(),
                Some(format!("service:{name}").as_str())
            );
            assert_eq!(ip["devices"][0].as_str(), Some("/dev/net/tun:/dev/net/tun"));
            assert_eq!(ip["cap_add"][0].as_str(), Some("NET_ADMIN"));
            assert_eq!(
                ip["depends_on"][name.as_str()]["condition"].as_str(),
                Some("service_healthy")
            );
        }
        // 128 nodes, their IP services, pki, prometheus and grafana, nothing else.
        assert_eq!(services.len(), 2 * 128 + 3);
        // Prometheus scrapes exactly the metrics addresses of the rack file.
        let prom = yaml(text(&files, "prometheus/prometheus.yml"));
        let targets: std::collections::BTreeSet<String> = prom["scrape_configs"][0]
            ["static_configs"][0]["targets"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect();
        let expected: std::collections::BTreeSet<String> = shape
            .node_ids()
            .map(|id| rack.entry(id).metrics.clone())
            .collect();
        assert_eq!(targets, expected);
        // It serves the rack's console pages from the generated files.
        let p = &services["prometheus"];
        let cmd: Vec<&str> = p["command"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert!(
            cmd.contains(&"--web.console.templates=/etc/prometheus/consoles"),
            "{cmd:?}"
        );
        assert!(
            cmd.contains(&"--web.console.libraries=/etc/prometheus/console_libraries"),
            "{cmd:?}"
        );
        let volumes: Vec<&str> = p["volumes"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        for (dir, mount) in [
            ("consoles", "/etc/prometheus/consoles"),
            ("console_libraries", "/etc/prometheus/console_libraries"),
        ] {
            assert!(
                volumes.contains(&format!("./prometheus/{dir}:{mount}:ro").as_str()),
                "{volumes:?}"
            );
        }
        for page in ["consoles/exanet-rack.html", "console_libraries/exanet.lib"] {
            assert!(!text(&files, &format!("prometheus/{page}")).is_empty());
        }
        let env = text(&files, ".env");
        assert!(env.contains("COMPOSE_PROJECT_NAME=exanet-4x4x2\n"));
        // More slots than services (compose v1 deadlocks otherwise).
        let limit: usize = env
            .lines()
            .find_map(|l| l.strip_prefix("COMPOSE_PARALLEL_LIMIT="))
            .unwrap()
            .parse()
            .unwrap();
        assert!(limit > services.len(), "{limit}");
    }

    #[test]
    fn static_addresses_stay_out_of_the_dynamic_range() {
        let mut o = opts("4x4x2");
        o.subnet = "192.168.40.0/23".parse().unwrap();
        let files = generate(&o).unwrap();
        let doc = yaml(text(&files, "docker-compose.yml"));
        let range = doc["networks"]["rack"]["ipam"]["config"][0]["ip_range"]
            .as_str()
            .unwrap();
        assert_eq!(range, "192.168.41.0/24");
        let last = doc["services"]["M8QDF4"]["networks"]["rack"]["ipv4_address"]
            .as_str()
            .unwrap();
        assert_eq!(last, "192.168.40.143");
    }

    #[test]
    fn swarm_rack_uses_service_names() {
        let files = generate(&opts("2x2x1")).unwrap();
        let rack: RackFile = toml::from_str(text(&files, "swarm/rack/rack.toml")).unwrap();
        assert_eq!(rack.nodes["M2QBF4"].link, "M2QBF4:7700");
        assert!(matches!(rack.deploy, Some(Deploy::External { .. })));
        let stack = yaml(text(&files, "swarm/docker-stack.yml"));
        assert_eq!(stack["version"].as_str(), Some("3.8"));
        let services = stack["services"].as_mapping().unwrap();
        assert_eq!(services.len(), 17);
        assert_eq!(
            stack["services"]["M1QAF1"]["deploy"]["endpoint_mode"].as_str(),
            Some("dnsrr")
        );
        // The 3.x schema has no depends_on conditions: none may appear.
        assert!(!text(&files, "swarm/docker-stack.yml").contains("depends_on"));
    }

    #[test]
    fn bad_options_fail_before_anything_is_generated() {
        let cases: Vec<(ComposeOptions, &str)> = vec![
            (
                ComposeOptions {
                    subnet: "10.1.2.0/24".parse().unwrap(),
                    ..opts("4x4x2")
                },
                "use a /23 or larger",
            ),
            (
                ComposeOptions {
                    grafana: true,
                    ..opts("2x2x1")
                },
                "--prometheus",
            ),
            (
                ComposeOptions {
                    name: Some("Bad Name".into()),
                    ..opts("2x2x1")
                },
                "--name",
            ),
            (opts("10x10x10"), "at most 1000 nodes"),
            (
                ComposeOptions {
                    image: "a b".into(),
                    ..opts("2x2x1")
                },
                "--image",
            ),
        ];
        for (o, what) in cases {
            let e = generate(&o).unwrap_err();
            assert!(e.is_bad_input(), "{e}");
            let text = e.to_string();
            assert!(text.contains(what) && !text.contains('\n'), "{text}");
            // run() checks the same way and so writes nothing.
            let out =
                std::env::temp_dir().join(format!("exactl-compose-bad-{}", std::process::id()));
            assert!(run(&out, &o).is_err());
            assert!(!out.exists());
        }
    }

    /// The committed examples under deploy/compose/ are exactly what the generator makes,
    /// so they cannot drift from it.
    #[test]
    fn committed_examples_are_current() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/compose");
        for shape in ["2x2x1", "4x4x2"] {
            let mut o = opts(shape);
            o.prometheus = true;
            o.grafana = true;
            assert_committed(
                &root.join(shape),
                &generate(&o).unwrap(),
                &format!(
                    "exactl rack compose --shape {shape} --prometheus --grafana \
                     --out deploy/compose/{shape}"
                ),
            );
        }
    }
}
