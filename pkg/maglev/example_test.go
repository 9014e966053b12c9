package maglev_test

import (
	"fmt"

	"github.com/cellium/cellium/pkg/maglev"
)

func Example() {
	backends := []string{"10.244.1.7:8080", "10.244.2.9:8080", "10.244.3.4:8080"}
	table, err := maglev.Table(backends, 251)
	if err != nil {
		panic(err)
	}

	slots := map[string]int{}
	for _, b := range table {
		slots[backends[b]]++
	}
	fmt.Println(len(table), "slots:", slots)

	// A flow goes to the backend in the slot its hash selects, on every
	// node and after every restart.
	flowHash := uint64(0x9e3779b97f4a7c15)
	fmt.Println("flow goes to", backends[table[flowHash%uint64(len(table))]])

	// Output:
	// 251 slots: map[10.244.1.7:8080:84 10.244.2.9:8080:84 10.244.3.4:8080:83]
	// flow goes to 10.244.2.9:8080
}
