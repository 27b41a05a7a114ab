//! `exactl rack k8s`: a virtual rack as a Kubernetes StatefulSet.
//!
//! ```text
//! OUT/exanet.yaml          headless Service + StatefulSet (one pod per node)
//! OUT/kustomization.yaml   ConfigMap (rack.toml, node list) and Secret (certificates)
//! OUT/rack/rack.toml       nodes addressed by pod DNS name: NAME-<id>.NAME:7700
//! OUT/rack/nodes           node name of each pod ordinal, one per line
//! ```
//!
//! Deploy: `exactl --rack OUT/rack rack pki && kubectl apply -k OUT` (add `-n NS` or a
//! `namespace:` in the kustomization for another namespace).
//!
//! Pod `NAME-i` runs node id `i`: its container reads line `i + 1` of the node list (the
//! ordinal is the end of the pod's host name). The Service publishes not-ready addresses
//! because a node is ready only once its links are up, and its links come up only once
//! its neighbours' names resolve; for the same reason pods start in parallel, not one by
//! one. The rack directory is an emptyDir (the daemon writes its sockets there) with the
//! rack file and certificates mounted into it. The CA key stays with the operator.

use std::path::Path;

use exanet_control::rack::Deploy;
use exanet_proto::Shape;

use crate::error::Result;
use crate::yaml::{flow, int, render, render_all, s, MapBuilder, Yaml};
use crate::{
    check_options, rack_file, rack_name, rack_toml, write_files, GenFile, LINK_PORT, METRICS_PORT,
    RACK_GITIGNORE, RACK_MOUNT,
};

/// Where the ConfigMap (rack.toml, nodes) is mounted whole in the pod.
const CONFIG_MOUNT: &str = "/etc/exanet";

#[derive(Clone, Debug)]
pub struct K8sOptions {
    pub shape: Shape,
    /// StatefulSet, Service and rack name [default: exanet-<shape>].
    pub name: Option<String>,
    pub image: String,
}

impl K8sOptions {
    /// Defaults for `shape` (tests build on them).
    #[cfg(test)]
    pub fn new(shape: Shape) -> K8sOptions {
        K8sOptions {
            shape,
            name: None,
            image: crate::DEFAULT_IMAGE.to_string(),
        }
    }
    pub fn name(&self) -> String {
        rack_name(self.name.as_deref(), self.shape)
    }
}

/// The container's start script: node name from the pod ordinal.
fn start_script() -> String {
    format!(
        "set -eu\n\
         ordinal=\"${{HOSTNAME##*-}}\"\n\
         node=\"$(sed -n \"$((ordinal + 1))p\" {CONFIG_MOUNT}/nodes)\"\n\
         if [ -z \"$node\" ]; then echo \"exanet: no node for pod ordinal $ordinal in {CONFIG_MOUNT}/nodes\" >&2; exit 2; fi\n\
         exec exanetd --rack {RACK_MOUNT} --node \"$node\"\n"
    )
}

pub fn generate(opts: &K8sOptions) -> Result<Vec<GenFile>> {
    let name = opts.name();
    check_options(&name, opts.shape, &opts.image)?;
    let shape = opts.shape;
    let n = shape.nodes();
    let names: Vec<String> = shape.node_ids().map(|id| shape.display(id)).collect();
    let labels = || {
        MapBuilder::new()
            .put("app.kubernetes.io/name", s("exanet"))
            .put("org.exanet.rack", s(&name))
            .build()
    };
    // A Kubernetes object of the rack: its kind, named after the rack and labelled.
    let object = |api_version: &str, kind: &str| {
        MapBuilder::new()
            .put("apiVersion", s(api_version))
            .put("kind", s(kind))
            .put(
                "metadata",
                MapBuilder::new()
                    .put("name", s(&name))
                    .put("labels", labels())
                    .build(),
            )
    };
    let service = object("v1", "Service")
        .put(
            "spec",
            MapBuilder::new()
                .put("clusterIP", s("None"))
                .note(
                    "Names resolve before pods are ready: readiness waits for the links,\n\
                     which need the names.",
                    "publishNotReadyAddresses",
                    Yaml::Bool(true),
                )
                .put("selector", labels())
                .put(
                    "ports",
                    Yaml::List(vec![
                        port("link", LINK_PORT, "UDP", false),
                        port("metrics", METRICS_PORT, "TCP", false),
                    ]),
                )
                .build(),
        )
        .build();
    let probe = |path: &str, period: i64| {
        MapBuilder::new()
            .put(
                "httpGet",
                MapBuilder::new()
                    .put("path", s(path))
                    .put("port", s("metrics"))
                    .build(),
            )
            .put("periodSeconds", int(period))
            .put("failureThreshold", int(3))
            .build()
    };
    let container = MapBuilder::new()
        .put("name", s("exanetd"))
        .put("image", s(&opts.image))
        .put("imagePullPolicy", s("IfNotPresent"))
        .note(
            "Node name from the pod ordinal: pod NAME-i runs line i+1 of the node list.",
            "command",
            flow(["/bin/sh", "-c", &start_script()]),
        )
        .put(
            "env",
            Yaml::List(vec![
                MapBuilder::new()
                    .put("name", s("EXANET_RACK"))
                    .put("value", s(RACK_MOUNT))
                    .build(),
                MapBuilder::new()
                    .put("name", s("RUST_LOG"))
                    .put("value", s("info"))
                    .build(),
            ]),
        )
        .put(
            "ports",
            Yaml::List(vec![
                port("link", LINK_PORT, "UDP", true),
                port("metrics", METRICS_PORT, "TCP", true),
            ]),
        )
        .put("livenessProbe", probe("/health", 10))
        .put("readinessProbe", probe("/ready", 5))
        .note(
            "Workloads attached to the node share its memory limit (the NI's regions are\n\
             memfds created by the daemon).",
            "resources",
            MapBuilder::new()
                .put(
                    "requests",
                    MapBuilder::new()
                        .put("cpu", s("10m"))
                        .put("memory", s("32Mi"))
                        .build(),
                )
                .put("limits", MapBuilder::new().put("memory", s("1Gi")).build())
                .build(),
        )
        .put(
            "volumeMounts",
            Yaml::List(vec![
                MapBuilder::new()
                    .put("name", s("rack"))
                    .put("mountPath", s(RACK_MOUNT))
                    .build(),
                MapBuilder::new()
                    .put("name", s("config"))
                    .put("mountPath", s(format!("{RACK_MOUNT}/rack.toml")))
                    .put("subPath", s("rack.toml"))
                    .build(),
                MapBuilder::new()
                    .put("name", s("config"))
                    .put("mountPath", s(CONFIG_MOUNT))
                    .build(),
                MapBuilder::new()
                    .put("name", s("tls"))
                    .put("mountPath", s(format!("{RACK_MOUNT}/tls")))
                    .put("readOnly", Yaml::Bool(true))
                    .build(),
            ]),
        )
        .build();
    let pod = MapBuilder::new()
        .put(
            "metadata",
            MapBuilder::new()
                .put("labels", labels())
                .put(
                    "annotations",
                    MapBuilder::new()
                        .put("prometheus.io/scrape", s("true"))
                        .put("prometheus.io/port", s(METRICS_PORT.to_string()))
                        .put("prometheus.io/path", s("/metrics"))
                        .build(),
                )
                .build(),
        )
        .put(
            "spec",
            MapBuilder::new()
                .put("terminationGracePeriodSeconds", int(10))
                .put("containers", Yaml::List(vec![container]))
                .put(
                    "volumes",
                    Yaml::List(vec![
                        MapBuilder::new()
                            .put("name", s("rack"))
                            .put("emptyDir", Yaml::Map(vec![]))
                            .build(),
                        MapBuilder::new()
                            .put("name", s("config"))
                            .put(
                                "configMap",
                                MapBuilder::new()
                                    .put("name", s(format!("{name}-rack")))
                                    .build(),
                            )
                            .build(),
                        MapBuilder::new()
                            .put("name", s("tls"))
                            .put(
                                "secret",
                                MapBuilder::new()
                                    .put("secretName", s(format!("{name}-tls")))
                                    // 0400: the keys are readable by the daemon only.
                                    .put("defaultMode", int(0o400))
                                    .build(),
                            )
                            .build(),
                    ]),
                )
                .build(),
        )
        .build();
    let statefulset = object("apps/v1", "StatefulSet")
        .put(
            "spec",
            MapBuilder::new()
                .put("serviceName", s(&name))
                .put("replicas", int(n))
                .note(
                    "All pods at once: a node is ready only when its neighbours are up.",
                    "podManagementPolicy",
                    s("Parallel"),
                )
                .put(
                    "selector",
                    MapBuilder::new().put("matchLabels", labels()).build(),
                )
                .put("template", pod)
                .build(),
        )
        .build();
    let manifests = format!(
        "# Rack {name}: {shape} ({n} nodes), one exanetd pod per node.\n\
         # Generated by `exactl rack k8s`; deploy with: exactl --rack rack rack pki && kubectl apply -k .\n{}",
        render_all(&[service, statefulset])
    );

    let mut secret_files = vec![s("ca.pem=rack/tls/ca.pem")];
    for node in &names {
        for ext in ["pem", "key"] {
            secret_files.push(s(format!("{node}.{ext}=rack/tls/{node}.{ext}")));
        }
    }
    let kustomization = MapBuilder::new()
        .put("apiVersion", s("kustomize.config.k8s.io/v1beta1"))
        .put("kind", s("Kustomization"))
        .put("resources", Yaml::List(vec![s("exanet.yaml")]))
        .put(
            "configMapGenerator",
            Yaml::List(vec![MapBuilder::new()
                .put("name", s(format!("{name}-rack")))
                .put(
                    "files",
                    Yaml::List(vec![s("rack.toml=rack/rack.toml"), s("nodes=rack/nodes")]),
                )
                .build()]),
        )
        .note(
            "The certificates `exactl --rack rack rack pki` makes: the CA certificate and each\n\
             node's certificate and key. The CA key (rack/tls/ca.key) stays with the operator.",
            "secretGenerator",
            Yaml::List(vec![MapBuilder::new()
                .put("name", s(format!("{name}-tls")))
                .put("files", Yaml::List(secret_files))
                .build()]),
        )
        .build();

    // Pod i of the StatefulSet, by its DNS name under the headless Service.
    let rack = rack_file(
        &name,
        shape,
        |i| format!("{name}-{i}.{name}"),
        Deploy::External {
            how: format!(
                "Kubernetes StatefulSet {name}: `kubectl delete pod {name}-ID` restarts node ID, \
                 `kubectl delete -k DIR` stops the rack"
            ),
        },
    );
    let mut node_list = names.join("\n");
    node_list.push('\n');
    Ok(vec![
        GenFile::new("exanet.yaml", manifests),
        GenFile::new("kustomization.yaml", render(&kustomization)),
        GenFile::new(
            "rack/rack.toml",
            rack_toml(
                &rack,
                &format!(
                    "Rack {name} ({shape}, {n} nodes) on Kubernetes: pod {name}-ID runs node ID and is\n\
                     reached as {name}-ID.{name} (headless Service {name}).\n\
                     Generated by `exactl rack k8s`; certificates: `exactl rack pki`."
                ),
            )?,
        ),
        GenFile::new("rack/nodes", node_list),
        GenFile::new("rack/.gitignore", RACK_GITIGNORE),
    ])
}

fn port(name: &str, number: u16, protocol: &str, container: bool) -> Yaml {
    MapBuilder::new()
        .put("name", s(name))
        .put(
            if container { "containerPort" } else { "port" },
            int(number),
        )
        .put("protocol", s(protocol))
        .build()
}

/// Generates and writes; returns what was made and how to deploy it.
pub fn run(out: &Path, opts: &K8sOptions) -> Result<String> {
    let files = generate(opts)?;
    write_files(out, &files)?;
    Ok(format!(
        "wrote Kubernetes rack {:?} ({}, {} pods) to {}\n\
         deploy: exactl --rack {}/rack rack pki && kubectl apply -k {}",
        opts.name(),
        opts.shape,
        opts.shape.nodes(),
        out.display(),
        out.display(),
        out.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{assert_committed, text};
    use exanet_control::rack::{Rack, RackFile};
    use serde::Deserialize;
    use serde_yaml::Value;
    use std::collections::BTreeMap;

    #[test]
    fn manifests_name_every_node_exactly_once() {
        for shape in ["1x1x1", "2x2x1", "4x4x2"] {
            let opts = K8sOptions::new(shape.parse().unwrap());
            let files = generate(&opts).unwrap();
            let docs: Vec<Value> = serde_yaml::Deserializer::from_str(text(&files, "exanet.yaml"))
                .map(|d| Value::deserialize(d).unwrap())
                .collect();
            assert_eq!(docs.len(), 2);
            let sts = docs.iter().find(|d| d["kind"] == "StatefulSet").unwrap();
            let svc = docs.iter().find(|d| d["kind"] == "Service").unwrap();
            let name = opts.name();
            assert_eq!(sts["spec"]["serviceName"].as_str(), Some(name.as_str()));
            assert_eq!(svc["metadata"]["name"].as_str(), Some(name.as_str()));
            assert_eq!(svc["spec"]["clusterIP"].as_str(), Some("None"));
            let shape: Shape = shape.parse().unwrap();
            let replicas = sts["spec"]["replicas"].as_u64().unwrap();
            assert_eq!(replicas, u64::from(shape.nodes()));
            // Ordinal i -> line i+1 of the node list -> node id i, every node once.
            let list: Vec<&str> = text(&files, "rack/nodes").lines().collect();
            assert_eq!(list.len() as u64, replicas);
            let mut seen = std::collections::HashSet::new();
            for (i, n) in list.iter().enumerate() {
                assert_eq!(shape.parse_node(n).unwrap().0 as usize, i);
                assert!(seen.insert(*n));
            }
            // The rack file addresses node i at pod i's DNS name.
            let rack: RackFile = toml::from_str(text(&files, "rack/rack.toml")).unwrap();
            let rack = Rack::new(Path::new("."), rack).unwrap();
            for id in shape.node_ids() {
                assert_eq!(
                    rack.entry(id).link,
                    format!("{name}-{}.{name}:{LINK_PORT}", id.0)
                );
            }
            // The Secret carries every node's certificate and key once, and not the CA key.
            let k: Value = serde_yaml::from_str(text(&files, "kustomization.yaml")).unwrap();
            let mut keys: BTreeMap<String, usize> = BTreeMap::new();
            for f in k["secretGenerator"][0]["files"].as_sequence().unwrap() {
                let (key, path) = f.as_str().unwrap().split_once('=').unwrap();
                assert_eq!(path, format!("rack/tls/{key}"));
                *keys.entry(key.to_string()).or_default() += 1;
            }
            assert!(keys.values().all(|&c| c == 1));
            assert_eq!(keys.len() as u32, 1 + 2 * shape.nodes());
            assert!(!keys.contains_key("ca.key"));
            assert!(list.iter().all(|n| keys.contains_key(&format!("{n}.key"))));
            // The volumes the container mounts are the pod's.
            let pod = &sts["spec"]["template"]["spec"];
            let vols: Vec<&str> = pod["volumes"]
                .as_sequence()
                .unwrap()
                .iter()
                .map(|v| v["name"].as_str().unwrap())
                .collect();
            for m in pod["containers"][0]["volumeMounts"].as_sequence().unwrap() {
                assert!(vols.contains(&m["name"].as_str().unwrap()));
            }
        }
    }

    /// The start script picks the right node for an ordinal (run with the system's sh).
    #[test]
    fn start_script_maps_ordinal_to_node() {
        let dir = std::env::temp_dir().join(format!("exactl-k8s-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("nodes"), "M1QAF1\nM1QAF2\nM1QAF3\n").unwrap();
        let script = start_script()
            .replace(CONFIG_MOUNT, dir.to_str().unwrap())
            .replace("exec exanetd", "echo");
        for (host, want) in [
            ("exanet-2x2x1-0", Some("M1QAF1")),
            ("exanet-2x2x1-2", Some("M1QAF3")),
            ("exanet-2x2x1-7", None),
        ] {
            let out = std::process::Command::new("sh")
                .args(["-c", &script])
                .env("HOSTNAME", host)
                .output()
                .unwrap();
            match want {
                Some(node) => {
                    assert!(out.status.success());
                    let line = String::from_utf8_lossy(&out.stdout);
                    assert_eq!(line.trim(), format!("--rack {RACK_MOUNT} --node {node}"));
                }
                None => assert_eq!(out.status.code(), Some(2)),
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// deploy/k8s/4x4x2 is exactly what the generator makes.
    #[test]
    fn committed_example_is_current() {
        assert_committed(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/k8s/4x4x2"),
            &generate(&K8sOptions::new("4x4x2".parse().unwrap())).unwrap(),
            "exactl rack k8s --shape 4x4x2 --out deploy/k8s/4x4x2",
        );
    }

    #[test]
    fn bad_options_are_usage_errors() {
        let mut o = K8sOptions::new("2x2x1".parse().unwrap());
        o.name = Some("UPPER".into());
        assert!(generate(&o).unwrap_err().is_bad_input());
        let o = K8sOptions::new("10x10x10".parse().unwrap());
        assert!(generate(&o).unwrap_err().is_bad_input());
    }
}
