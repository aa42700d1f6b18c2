module fake

go 1.22
