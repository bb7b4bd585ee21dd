// The rig's probe image: one HTTPS GET from inside the cluster, for tests that check
// what a Pod's caller gets (e.g. banlieue's /metrics with and without a ServiceAccount
// token). Usage: probe URL [TOKEN_FILE]. Prints "status=<code>" (or "error=<why>") and
// exits 0 when it got an answer. The server's certificate is not verified: the callers
// under test prove who they are with the token, as Prometheus' scrapers do.
package main

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Println("error=usage: probe URL [TOKEN_FILE]")
		os.Exit(2)
	}
	request, err := http.NewRequest(http.MethodGet, os.Args[1], nil)
	if err != nil {
		fmt.Printf("error=%v\n", err)
		os.Exit(2)
	}
	if len(os.Args) > 2 {
		token, err := os.ReadFile(os.Args[2])
		if err != nil {
			fmt.Printf("error=reading the token: %v\n", err)
			os.Exit(2)
		}
		request.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	}
	client := &http.Client{
		Timeout:   20 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}},
	}
	var last error
	for attempt := 0; attempt < 20; attempt++ {
		response, err := client.Do(request)
		if err == nil {
			response.Body.Close()
			fmt.Printf("status=%d\n", response.StatusCode)
			return
		}
		last = err
		time.Sleep(time.Second)
	}
	fmt.Printf("error=%v\n", last)
	os.Exit(1)
}
