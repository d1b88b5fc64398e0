// Package kubernetes tests the manifests of deploy/kubernetes: rendered
// by kustomize (a Go tool pinned in tools/kustomize), decoded strictly
// into the k8s.io/api types, checked for what running Warden across
// three zones needs, and their wardend flags parsed with wardend's own
// definitions. A module of its own, so that the server's does not
// depend on k8s.io/api.
package kubernetes

import (
	"bytes"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/warden-dev/warden/cmd/wardend/flags"
	"github.com/warden-dev/warden/deploy/deploytest"
)

// objects are a rendering's objects by kind.
type objects struct {
	statefulSets []appsv1.StatefulSet
	services     []corev1.Service
	pdbs         []policyv1.PodDisruptionBudget
	cronJobs     []batchv1.CronJob
	pvcs         []corev1.PersistentVolumeClaim
	namespaces   []corev1.Namespace
}

// render runs kustomize build on dir and decodes every object strictly
// (an unknown or duplicated field fails).
func render(t *testing.T, dir string) objects {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "tool", "-modfile="+filepath.Join(root, "tools/kustomize/go.mod"), "kustomize", "build", dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kustomize build %s: %v\n%s", dir, err, stderr.String())
	}
	var objs objects
	for _, doc := range strings.Split(string(out), "\n---\n") {
		var meta struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatal(err)
		}
		var target any
		switch meta.Kind {
		case "StatefulSet":
			objs.statefulSets = append(objs.statefulSets, appsv1.StatefulSet{})
			target = &objs.statefulSets[len(objs.statefulSets)-1]
		case "Service":
			objs.services = append(objs.services, corev1.Service{})
			target = &objs.services[len(objs.services)-1]
		case "PodDisruptionBudget":
			objs.pdbs = append(objs.pdbs, policyv1.PodDisruptionBudget{})
			target = &objs.pdbs[len(objs.pdbs)-1]
		case "CronJob":
			objs.cronJobs = append(objs.cronJobs, batchv1.CronJob{})
			target = &objs.cronJobs[len(objs.cronJobs)-1]
		case "PersistentVolumeClaim":
			objs.pvcs = append(objs.pvcs, corev1.PersistentVolumeClaim{})
			target = &objs.pvcs[len(objs.pvcs)-1]
		case "Namespace":
			objs.namespaces = append(objs.namespaces, corev1.Namespace{})
			target = &objs.namespaces[len(objs.namespaces)-1]
		default:
			t.Fatalf("%s renders a %q, which the test does not know:\n%s", dir, meta.Kind, doc)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), target); err != nil {
			t.Fatalf("%s: a %s does not decode strictly: %v\n%s", dir, meta.Kind, err, doc)
		}
	}
	return objs
}

// expand replaces the $(VAR) references Kubernetes expands in args.
func expand(s string, vars map[string]string) string {
	for k, v := range vars {
		s = strings.ReplaceAll(s, "$("+k+")", v)
	}
	return s
}

// envFrom returns the container's env var name's downward-API field.
func envFrom(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			return e.ValueFrom.FieldRef.FieldPath
		}
	}
	return ""
}

// The base and the example overlay render to what three zones need: one
// StatefulSet per zone, pinned there and spread one per zone, started in
// parallel, probed on /readyz and /healthz over HTTPS, with requests, a
// volume, TLS and auth from Secrets, non-root and read-only; a headless
// Service that publishes pods not ready; a client Service; a
// PodDisruptionBudget that keeps a quorum; a backup CronJob. Every
// wardend flag parses with wardend's own definitions, and the node ids
// it derives are the initial members', each advertising the addresses
// its entry names.
func TestManifests(t *testing.T) {
	deploytest.ClearEnv(t)
	for _, dir := range []string{"base", "overlays/example"} {
		t.Run(dir, func(t *testing.T) {
			objs := render(t, dir)
			namespace := "default"
			if dir != "base" {
				if len(objs.namespaces) != 1 {
					t.Fatalf("the overlay renders %d namespaces", len(objs.namespaces))
				}
				namespace = objs.namespaces[0].Name
			}
			checkStatefulSets(t, objs, namespace, dir != "base")
			checkServices(t, objs)
			if len(objs.pdbs) != 1 || objs.pdbs[0].Spec.MinAvailable == nil || *objs.pdbs[0].Spec.MinAvailable != intstr.FromInt32(2) ||
				objs.pdbs[0].Spec.Selector.MatchLabels["app.kubernetes.io/name"] != "warden" {
				t.Errorf("PodDisruptionBudgets: %+v, want one keeping 2 warden pods", objs.pdbs)
			}
			if len(objs.cronJobs) != 1 {
				t.Fatalf("%d CronJobs, want the backup", len(objs.cronJobs))
			}
			cj := objs.cronJobs[0].Spec
			backup := cj.JobTemplate.Spec.Template.Spec.Containers[0]
			if cj.ConcurrencyPolicy != batchv1.ForbidConcurrent || !slices.Contains(backup.Args, "backup") || !slices.Contains(backup.Args, "--timestamped") ||
				!slices.ContainsFunc(backup.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == "/backups" }) {
				t.Errorf("the backup CronJob: %+v", cj)
			}
			if !slices.ContainsFunc(objs.pvcs, func(p corev1.PersistentVolumeClaim) bool { return p.Name == "warden-backups" }) {
				t.Error("no warden-backups volume claim for the backups")
			}
		})
	}
}

func checkStatefulSets(t *testing.T, objs objects, namespace string, overlay bool) {
	t.Helper()
	if len(objs.statefulSets) != 3 {
		t.Fatalf("%d StatefulSets, want one per zone", len(objs.statefulSets))
	}
	type node struct{ raft, listen string }
	members := map[uint64]node{}
	var initial string
	zones := map[string]bool{}
	for _, s := range objs.statefulSets {
		spec := s.Spec.Template.Spec
		if s.Spec.PodManagementPolicy != appsv1.ParallelPodManagement || s.Spec.Replicas == nil || *s.Spec.Replicas != 1 || s.Spec.ServiceName != "warden-peers" {
			t.Errorf("%s: podManagementPolicy %q, replicas %v, serviceName %q", s.Name, s.Spec.PodManagementPolicy, s.Spec.Replicas, s.Spec.ServiceName)
		}
		terms := spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
		if len(terms) != 1 || len(terms[0].MatchExpressions) != 1 || terms[0].MatchExpressions[0].Key != "topology.kubernetes.io/zone" || len(terms[0].MatchExpressions[0].Values) != 1 {
			t.Fatalf("%s: node affinity %+v, want one zone", s.Name, terms)
		}
		zone := terms[0].MatchExpressions[0].Values[0]
		zones[zone] = true
		if len(spec.TopologySpreadConstraints) != 1 {
			t.Fatalf("%s: %d topology spread constraints", s.Name, len(spec.TopologySpreadConstraints))
		}
		tsc := spec.TopologySpreadConstraints[0]
		if tsc.TopologyKey != "topology.kubernetes.io/zone" || tsc.MaxSkew != 1 || tsc.WhenUnsatisfiable != corev1.DoNotSchedule || tsc.LabelSelector.MatchLabels["app.kubernetes.io/name"] != "warden" {
			t.Errorf("%s: topology spread %+v", s.Name, tsc)
		}
		sc := spec.SecurityContext
		if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser != 65532 || sc.FSGroup == nil || *sc.FSGroup != 65532 {
			t.Errorf("%s: pod security context %+v, want non-root 65532 with fsGroup 65532", s.Name, sc)
		}
		if len(spec.Containers) != 1 {
			t.Fatalf("%s: %d containers", s.Name, len(spec.Containers))
		}
		c := spec.Containers[0]
		if overlay && c.Image != "registry.example.com/warden:v0.1.0" {
			t.Errorf("%s: image %q, the overlay's not applied", s.Name, c.Image)
		}
		for probe, want := range map[*corev1.Probe]string{c.ReadinessProbe: "/readyz", c.LivenessProbe: "/healthz"} {
			if probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Path != want || probe.HTTPGet.Scheme != corev1.URISchemeHTTPS || probe.HTTPGet.Port.String() != "api" {
				t.Errorf("%s: a probe of %s is %+v", s.Name, want, probe)
			}
		}
		if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
			t.Errorf("%s: resources %+v, want cpu and memory requests and a memory limit", s.Name, c.Resources)
		}
		csc := c.SecurityContext
		if csc == nil || csc.ReadOnlyRootFilesystem == nil || !*csc.ReadOnlyRootFilesystem || csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation ||
			csc.Capabilities == nil || !slices.Contains(csc.Capabilities.Drop, "ALL") {
			t.Errorf("%s: container security context %+v", s.Name, csc)
		}
		if envFrom(c, "POD_NAME") != "metadata.name" || envFrom(c, "POD_NAMESPACE") != "metadata.namespace" {
			t.Errorf("%s: POD_NAME and POD_NAMESPACE must come from the downward API: %+v", s.Name, c.Env)
		}
		secrets := map[string]string{} // mount path → secret
		for _, m := range c.VolumeMounts {
			i := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name })
			if i >= 0 && spec.Volumes[i].Secret != nil {
				secrets[m.MountPath] = spec.Volumes[i].Secret.SecretName
			}
		}
		if secrets["/etc/warden/api"] != "warden-api-tls" || secrets["/etc/warden/peer"] != "warden-peer-"+zone || secrets["/etc/warden/auth"] != "warden-auth" {
			t.Errorf("%s: secrets mounted %v", s.Name, secrets)
		}
		if len(s.Spec.VolumeClaimTemplates) != 1 || s.Spec.VolumeClaimTemplates[0].Name != "data" ||
			!slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "data" && m.MountPath == "/data" }) {
			t.Errorf("%s: the data volume %+v", s.Name, s.Spec.VolumeClaimTemplates)
		}
		if overlay && s.Spec.VolumeClaimTemplates[0].Spec.StorageClassName == nil {
			t.Errorf("%s: the overlay's storage class is not applied", s.Name)
		}

		// The flags, as Kubernetes expands them for the StatefulSet's pod 0.
		pod := s.Name + "-0"
		vars := map[string]string{"POD_NAME": pod, "POD_NAMESPACE": namespace}
		var args []string
		for _, a := range c.Args {
			args = append(args, expand(a, vars))
		}
		var cli flags.CLI
		k, err := flags.Parser(&cli, "test")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := k.Parse(args); err != nil {
			t.Fatalf("%s: wardend refuses its flags: %v\n%s", s.Name, err, strings.Join(args, "\n"))
		}
		if err := cli.ResolveNodeID(func() (string, error) { return pod, nil }); err != nil || cli.NodeID == 0 {
			t.Fatalf("%s: the node id: %d, %v", s.Name, cli.NodeID, err)
		}
		if cli.Zone != zone || cli.Dev || cli.Insecure || cli.DataDir == "" || cli.TLSCert == "" || cli.PeerCert == "" {
			t.Errorf("%s: flags %+v (zone %q from the affinity)", s.Name, cli, zone)
		}
		if _, dup := members[cli.NodeID]; dup {
			t.Errorf("%s: node id %d is another StatefulSet's", s.Name, cli.NodeID)
		}
		members[cli.NodeID] = node{raft: cli.RaftAdvertise, listen: cli.Advertise}
		if initial != "" && cli.InitialMembers != initial {
			t.Errorf("%s: --initial-members differs from another StatefulSet's", s.Name)
		}
		initial = cli.InitialMembers
		if want := pod + ".warden-peers." + namespace + ".svc:7100"; cli.RaftAdvertise != want {
			t.Errorf("%s: --raft-advertise-addr %q, want %q", s.Name, cli.RaftAdvertise, want)
		}
	}
	if len(zones) != 3 {
		t.Errorf("the StatefulSets are pinned to zones %v, want three", zones)
	}
	var want []string
	for _, id := range []uint64{100, 200, 300} {
		m, ok := members[id]
		if !ok {
			t.Fatalf("node ids %v, want 100, 200 and 300", members)
		}
		want = append(want, fmt.Sprintf("%d=%s=%s", id, m.raft, m.listen))
	}
	if initial != strings.Join(want, ",") {
		t.Errorf("--initial-members %q, want the nodes as they advertise themselves: %q", initial, strings.Join(want, ","))
	}
}

func checkServices(t *testing.T, objs objects) {
	t.Helper()
	var peers, clients *corev1.Service
	for i, s := range objs.services {
		switch s.Name {
		case "warden-peers":
			peers = &objs.services[i]
		case "warden":
			clients = &objs.services[i]
		}
	}
	if peers == nil || peers.Spec.ClusterIP != corev1.ClusterIPNone || !peers.Spec.PublishNotReadyAddresses || len(peers.Spec.Ports) != 2 {
		t.Errorf("the headless peer Service: %+v", peers)
	}
	if clients == nil || clients.Spec.ClusterIP == corev1.ClusterIPNone || clients.Spec.PublishNotReadyAddresses || clients.Spec.Selector["app.kubernetes.io/name"] != "warden" {
		t.Errorf("the client Service: %+v", clients)
	}
}
