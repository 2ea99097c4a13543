// Command tiny is the one static binary of the cluster's locally built images (no registry here):
// `tiny pause` is the pod sandbox (holds the pod's namespaces, reaps zombies, exits on SIGTERM/SIGINT),
// `tiny serve ADDR` answers every HTTP request with the pod's hostname (proof that a pod runs and is
// reachable), `tiny get URL` prints what a URL answers (proof that a pod reaches a Service by DNS).
package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func pause() {
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range signals {
		if sig == syscall.SIGCHLD {
			// As PID 1 of the sandbox, reap whatever was re-parented to us.
			for {
				var status syscall.WaitStatus
				pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
			continue
		}
		os.Exit(0)
	}
}

func serve(addr string) {
	host, _ := os.Hostname()
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "tiny %s %s\n", host, r.URL.Path)
	})
	server := &http.Server{Addr: addr, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		signals := make(chan os.Signal, 1)
		signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
		<-signals
		os.Exit(0)
	}()
	if err := server.ListenAndServe(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func get(url string) {
	// Retried for 30 s: a Service just made ready may not be in kube-proxy's rules yet (refused).
	client := &http.Client{Timeout: 10 * time.Second}
	deadline := time.Now().Add(30 * time.Second)
	resp, err := client.Get(url)
	for err != nil && time.Now().Before(deadline) {
		fmt.Fprintln(os.Stderr, "retrying:", err)
		time.Sleep(500 * time.Millisecond)
		resp, err = client.Get(url)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Printf("%d %s", resp.StatusCode, body)
}

func main() {
	if len(os.Args) < 2 {
		pause()
	}
	switch os.Args[1] {
	case "pause":
		pause()
	case "serve":
		addr := ":8080"
		if len(os.Args) > 2 {
			addr = os.Args[2]
		}
		serve(addr)
	case "get":
		get(os.Args[2])
	default:
		fmt.Fprintf(os.Stderr, "usage: tiny pause | serve [ADDR] | get URL\n")
		os.Exit(2)
	}
}
