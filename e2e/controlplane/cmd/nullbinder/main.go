// Command nullbinder is the benchmark's floor: it lists and watches the pending pods of
// one schedulerName and POSTs one pods/binding per pod, round-robin over the nodes it
// listed at start, and nothing else (no filtering, scoring, cache, events or status
// writes). Whatever a scheduler does beyond this costs it throughput against this.
//
// At most --in-flight bindings are outstanding at once: a goroutine per pod of a parked
// backlog, all at once, overflows the API server's priority-and-fairness queue for the
// scheduler's flow (429 queue-full), and client-go then waits a second before each retry,
// which made an unbounded null binder slower than kube-scheduler.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the cluster")
	name := flag.String("scheduler-name", "null-binder", "schedulerName of the pods to bind")
	qps := flag.Float64("qps", 50, "client QPS (as the schedulers' clientConnection)")
	burst := flag.Int("burst", 100, "client burst")
	inFlight := flag.Int("in-flight", 64, "most bindings outstanding at once")
	flag.Parse()
	if *inFlight < 1 {
		fmt.Fprintln(os.Stderr, "nullbinder: --in-flight must be at least 1")
		os.Exit(2)
	}
	if err := run(*kubeconfig, *name, float32(*qps), *burst, *inFlight); err != nil {
		fmt.Fprintln(os.Stderr, "nullbinder:", err)
		os.Exit(1)
	}
}

func run(kubeconfig, name string, qps float32, burst, inFlight int) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = qps, burst
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{ResourceVersion: "0"})
	if err != nil {
		return err
	}
	if len(nodes.Items) == 0 {
		return fmt.Errorf("no nodes")
	}
	names := make([]string, len(nodes.Items))
	for i := range nodes.Items {
		names[i] = nodes.Items[i].Name
	}
	fmt.Fprintf(os.Stderr, "nullbinder: %d nodes, binding pods of %q at qps %g burst %d, %d in flight\n",
		len(names), name, qps, burst, inFlight)

	var next, bound, failed atomic.Int64
	slots := make(chan struct{}, inFlight)
	bind := func(pod *corev1.Pod) {
		slots <- struct{}{}
		defer func() { <-slots }()
		node := names[int(next.Add(1)-1)%len(names)]
		b := &corev1.Binding{
			ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID},
			Target:     corev1.ObjectReference{Kind: "Node", Name: node},
		}
		if err := client.CoreV1().Pods(pod.Namespace).Bind(ctx, b, metav1.CreateOptions{}); err != nil {
			if failed.Add(1) <= 10 {
				fmt.Fprintf(os.Stderr, "nullbinder: binding %s/%s: %v\n", pod.Namespace, pod.Name, err)
			}
			return
		}
		bound.Add(1)
	}
	selector := fields.AndSelectors(
		fields.OneTermEqualSelector("spec.schedulerName", name),
		fields.OneTermEqualSelector("spec.nodeName", ""),
	)
	lw := cache.NewListWatchFromClient(client.CoreV1().RESTClient(), "pods", metav1.NamespaceAll, selector)
	_, informer := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &corev1.Pod{},
		Handler: cache.ResourceEventHandlerFuncs{
			// One binding per pod seen pending, in a goroutine of its own as
			// kube-scheduler's binding cycle is, at most inFlight of them posting.
			AddFunc: func(obj any) {
				if pod, ok := obj.(*corev1.Pod); ok {
					go bind(pod)
				}
			},
		},
	})
	informer.Run(ctx.Done())
	fmt.Fprintf(os.Stderr, "nullbinder: bound %d, failed %d\n", bound.Load(), failed.Load())
	return nil
}
